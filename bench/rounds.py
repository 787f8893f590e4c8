"""Interleaved timing rounds for the peers benchmarks (peers_llm.py and
peers_mha.py, --rounds R).

Each contender is first timed once, in turn, right after its own setup. On a
card held at its power limit that order favours whoever comes after an idle
stretch: a JIT compile (FlexAttention, FA4) or a plan leaves the GPU cool
just before its contender is timed, and a rested kernel runs faster (on an
H200 one stof kernel timed 1.43 ms rested and 1.55-1.62 ms right after
other work, bench/results/llm-NVIDIA-H200-20261128-084820rounds2.md). So
the contenders that could be the best (within `near` of the fastest first
figure) are timed R - 1 more times, interleaved: round r in an order rotated
by r, every other round reversed, so that no contender keeps a place. Each
keeps the median of its R figures. No torch here: the caller passes its
bench and its synchronize.
"""


def interleave(times, timed, how, rounds, bench, sync=lambda: None, near=1.5):
    """times: {who: ms}, each contender's first figure, replaced by its
    median; timed: [(who, fn)] in the order first timed; how: {who: str},
    to which each contender's figures (or a failed round) are added. Returns
    {who: [ms, ...]} of the contenders timed again ({} with rounds <= 1)."""
    if rounds <= 1 or not timed:
        return {}

    def note(w, text):
        how[w] = how[w] + "; " + text if how.get(w) else text
    best = min(times[w] for w, _ in timed)
    again = [(w, fn) for w, fn in timed if times[w] <= near * best]
    figs = {w: [times[w]] for w, _ in again}
    for r in range(1, rounds):
        k = r % len(again)
        order = again[k:] + again[:k]
        for w, fn in (order[::-1] if r % 2 else order):
            try:
                figs[w].append(bench(fn))
            except Exception as e:  # it ran before: it keeps the figures it has
                note(w, "round %d failed: %s" % (r, repr(e)[:80]))
            finally:
                sync()
    for w, ts in figs.items():
        times[w] = sorted(ts)[len(ts) // 2]
        note(w, "median of " + " / ".join("%.4f" % t for t in ts))
    return figs
