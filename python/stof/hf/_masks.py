"""stof.hf._masks: what a transformers model's masks mean to stof.

Mapping only, no launches: the mask function transformers hands its mask
hook becomes a spec ('dense', 'causal', 'causal_window:W', 'window:2W');
a 2-D padding mask becomes per-sequence lengths (stof's seq_lens, which
take padding at the end of each sequence only); a 4-D boolean or additive
mask becomes a stof.Mask, made once per distinct content and kept; and a
user's own spec (stof.hf.mask) stands for the model's pattern, for the
process, a block of code or one model.
"""
import ctypes
import hashlib
import threading
import weakref

import torch

from .. import _lib as L
from .._mask import Mask

# ---- the user's own spec -----------------------------------------------------------------

_process_spec = [None]
_model_specs = {}           # id(config) -> spec, while the config lives


def _check_spec(spec):
    if spec is not None and not isinstance(spec, (str, Mask)):
        raise L.InvalidArgumentError("a stof.hf mask is a spec str, a stof.Mask or None, got %s"
                                     % type(spec).__name__)


def configs_of(model):
    """The configs of every transformers model inside model (itself, a
    SentenceTransformer's, a multimodal model's sub-models)."""
    found = []
    for m in model.modules() if hasattr(model, "modules") else [model]:
        c = getattr(m, "config", None)
        if c is not None and hasattr(c, "to_dict") and all(c is not f for f in found):
            found.append(c)
    if not found:
        raise L.InvalidArgumentError("%s holds no transformers model (no module with a config)"
                                     % type(model).__name__)
    return found


def _set(configs, spec):
    if configs is None:
        _process_spec[0] = spec
        return
    for c in configs:
        if spec is None:
            _model_specs.pop(id(c), None)
        else:
            if id(c) not in _model_specs:
                weakref.finalize(c, _model_specs.pop, id(c), None)
            _model_specs[id(c)] = spec


class mask:
    """stof.hf.mask(spec, model=None): the mask stof's attention uses in
    place of the model's own pattern (causal, window, dense); padding still
    applies, as seq_lens. spec: a spec str ("window:256+global:64"), a
    stof.Mask, or None to go back to the model's own.

    Without model= it holds for the whole process (all threads); with it,
    for that model only (a setting for the process wins over one for a
    model). It is a plain setter, and a context manager too: at the end of
    a `with stof.hf.mask(...):` block the previous setting comes back."""

    def __init__(self, spec, model=None):
        _check_spec(spec)
        self._configs = None if model is None else configs_of(model)
        if self._configs is None:
            self._prev = [_process_spec[0]]
        else:
            self._prev = [_model_specs.get(id(c)) for c in self._configs]
        self.spec = spec
        _set(self._configs, spec)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._configs is None:
            _set(None, self._prev[0])
        else:
            for c, p in zip(self._configs, self._prev):
                _set([c], p)
        return False


def user_spec(config):
    """The user's spec for a model of this config, or None."""
    s = _process_spec[0]
    if s is None and config is not None:
        s = _model_specs.get(id(config))
    return s


# ---- transformers' mask functions ------------------------------------------------------


def _closure(fn, name):
    code = getattr(fn, "__code__", None)
    if code is None or fn.__closure__ is None or name not in code.co_freevars:
        return None
    return fn.__closure__[code.co_freevars.index(name)].cell_contents


def _terms(fn):
    """The parts of a mask function joined by and_masks, as
    ('causal' | 'dense' | ('back', W) | ('near', W) | ('packed', ids))
    terms; None for a part stof does not know (chunks, overlays, user code).
    ids: the [B, L] sequence index of each token of packed sequences
    (transformers' find_packed_sequence_indices, from restarting
    position_ids)."""
    qual = getattr(fn, "__qualname__", "")
    mod = getattr(fn, "__module__", "") or ""
    if not mod.startswith("transformers."):
        return None
    if qual == "causal_mask_function":
        return ["causal"]
    if qual == "bidirectional_mask_function":
        return ["dense"]
    if qual == "sliding_window_overlay.<locals>.inner_mask":
        return [("back", _closure(fn, "sliding_window"))]
    if qual == "sliding_window_bidirectional_overlay.<locals>.inner_mask":
        return [("near", _closure(fn, "sliding_window"))]
    if qual == "packed_sequence_mask_function.<locals>.inner_mask":
        ids = _closure(fn, "packed_sequence_mask")
        return [("packed", ids)] if ids is not None else None
    if qual == "and_masks.<locals>.and_mask":
        parts = _closure(fn, "mask_functions")
        out = []
        for p in parts or ():
            t = _terms(p)
            if t is None:
                return None
            out += t
        return out or None
    return None


def spec_of_mask_function(fn):
    """The spec of one of transformers' mask functions (causal, bidirectional,
    their sliding windows), or None where stof has no spec for it (packed
    sequences among them: see packed_form)."""
    return _spec_of_terms(_terms(fn))


def _spec_of_terms(terms):
    if not terms or any(isinstance(t, tuple) and t[0] == "packed" for t in terms):
        return None
    causal = "causal" in terms
    windows = [t for t in terms if isinstance(t, tuple)]
    if any(not isinstance(w, int) or isinstance(w, bool) or w <= 0 for _, w in windows):
        return None
    back = [w for k, w in windows if k == "back"]
    near = [w for k, w in windows if k == "near"]
    if back and near or back and not causal or near and causal:
        return None
    if back:
        # kv > q - W and kv <= q: 0 <= q - kv < W.
        return "causal_window:%d" % min(back)
    if near:
        # |q - kv| <= W; stof's window:W2 is |q - k| <= W2 / 2.
        return "window:%d" % (2 * min(near))
    return "causal" if causal else "dense"


def packed_form(fn):
    """(spec, cu_seqlens, longest) where a mask function is a pattern stof
    has a spec for, within packed sequences (transformers' and_masks of it
    and packed_sequence_mask_function, made from restarting position_ids),
    else None. cu_seqlens: int32 on the ids' device over the batch's rows
    flattened ([B * L] tokens, each row's sequences in turn); longest: a
    host int, read once (a synchronisation, once per forward)."""
    terms = _terms(fn) or ()
    packed = [t[1] for t in terms if isinstance(t, tuple) and t[0] == "packed"]
    spec = _spec_of_terms([t for t in terms if not (isinstance(t, tuple) and t[0] == "packed")])
    if spec is None or len(packed) != 1 or packed[0].dim() != 2:
        return None
    import torch
    ids = packed[0]
    b, n = ids.shape
    # A sequence starts at each row's first token and where the index changes.
    starts = torch.ones(b, n, dtype=torch.bool, device=ids.device)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    at = torch.nonzero(starts.reshape(-1)).reshape(-1)
    cu = torch.cat([at, at.new_tensor([b * n])]).to(torch.int32)
    return spec, cu, int((cu[1:] - cu[:-1]).max())


def spec_of_module(module, kwargs):
    """The pattern of an attention call that came with no mask from the hook:
    the module's is_causal (or the call's) and its sliding window."""
    causal = kwargs.get("is_causal")
    if causal is None:
        causal = getattr(module, "is_causal", False)
    w = kwargs.get("sliding_window")
    if w is None:
        w = getattr(module, "sliding_window", None)
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        w = None
    if causal:
        return "causal_window:%d" % w if w else "causal"
    return "window:%d" % (2 * w) if w else "dense"


# ---- padding -----------------------------------------------------------------------------


def lengths_of_padding(pad):
    """(seq_lens, why) for a [B, L] boolean padding mask (True: a real token):
    (None, None) where nothing is padded; (int32 [B] lengths on pad's
    device, None) where every sequence's padding is at its end; (None, a
    sentence) otherwise (left padding, holes), which stof cannot take."""
    if pad is None:
        return None, None
    pad = pad.bool()
    n = pad.shape[-1]
    lens = pad.sum(-1, dtype=torch.int32)
    prefix = torch.arange(n, device=pad.device)[None, :] < lens[:, None]
    full, right = torch.stack([(lens == n).all(), (pad == prefix).all()]).tolist()
    if full:
        return None, None
    if not right:
        return None, ("a padding mask with padding before the end of a sequence (left padding); "
                      "stof takes per-sequence lengths")
    return lens.contiguous(), None


def lengths_of_step(pad, used, kv_length, batch, device):
    """(seqused_k, why) for a decoding step whose key tensor holds kv_length
    entries, the first `used` of them tokens (an int, or a 0-d device tensor
    as a StaticCache's offset is), the step's new rows last. pad: None, or
    the [B, kv_length] boolean padding mask over those keys (True: a real
    token). (None, None) where every entry is a used, real token; (int32 [B]
    lengths on the device, None) where the cache holds fewer than kv_length
    (a StaticCache's capacity: padding right-aligned, past the new rows);
    (None, a sentence) where padding stands among the used keys (left
    padding, holes), which stof.decode cannot take. One host read at most,
    where pad is given (as lengths_of_padding makes)."""
    if isinstance(used, int) and not 1 <= used <= kv_length:
        return None, "a decoding step with %d used keys in a cache of %d" % (used, kv_length)
    if pad is not None:
        pad = pad.bool()
        keys = torch.arange(kv_length, device=pad.device)[None, :]
        if not bool((pad | (keys >= used)).all()):
            return None, ("a decoding step's padding mask with padding among the cache's tokens "
                          "(left padding); stof.decode takes caches filled from their start")
    if isinstance(used, int) and used == kv_length:
        return None, None
    if isinstance(used, int):
        return torch.full((batch,), used, dtype=torch.int32, device=device), None
    return used.to(device=device, dtype=torch.int32).reshape(1).expand(batch).contiguous(), None


# ---- 4-D masks ---------------------------------------------------------------------------

_by_tensor = {}             # id(tensor) -> (weakref, version, (Mask or None, why))
_by_content = {}            # (lq, lk, sha256) -> Mask, kept
_lock = threading.Lock()


def _version(t):
    try:
        return t._version
    except RuntimeError:    # an inference tensor keeps no version counter
        return None


def mask_of_4d(t):
    """(stof.Mask, None) for a 4-D mask [B or 1, H or 1, Lq, Lk] that is the
    same for every batch entry and head: boolean (True: allowed) or additive
    (0: allowed, the dtype's minimum or -inf: not); else (None, why). The
    same tensor (unchanged) costs a dict lookup; a new tensor with content
    seen before costs one copy to the host and finds the Mask made then."""
    key = id(t)
    hit = _by_tensor.get(key)
    if hit is not None and hit[0]() is t and hit[1] == _version(t):
        return hit[2]
    got = _mask_of_4d(t)
    with _lock:
        if len(_by_tensor) > 64:
            for k in [k for k, v in _by_tensor.items() if v[0]() is None]:
                del _by_tensor[k]
        _by_tensor[key] = (weakref.ref(t), _version(t), got)
    return got


def _mask_of_4d(t):
    if t.dim() != 4:
        return None, "a %d-D attention mask" % t.dim()
    if t.dtype == torch.bool:
        allowed = t
    elif t.is_floating_point():
        allowed = t == 0
        blocked = t <= torch.finfo(t.dtype).min / 2
        if not bool((allowed | blocked).all()):
            return None, "an additive mask with values other than 0 and -inf (a bias)"
    else:
        allowed = t != 0
    first = allowed[:1, :1]
    if (t.shape[0] > 1 or t.shape[1] > 1) and not bool((allowed == first).all()):
        return None, "a 4-D mask that differs between batch entries or heads"
    plane = first[0, 0].to(device="cpu", dtype=torch.uint8).contiguous()
    lq, lk = plane.shape
    sha = hashlib.sha256(ctypes.string_at(plane.data_ptr(), lq * lk)).hexdigest()
    with _lock:
        m = _by_content.get((lq, lk, sha))
    if m is None:
        m = Mask.from_dense(plane)
        with _lock:
            m = _by_content.setdefault((lq, lk, sha), m)
    return m, None


def dense_of_spec(spec, lq, lk, device):
    """The [Lq, Lk] boolean matrix of a spec or Mask, for the sdpa fallback."""
    m = spec if isinstance(spec, Mask) else Mask(spec, lq, lk)
    return m.to_dense("torch", device)
