"""_torch: stof's torch.library custom ops, so torch.compile keeps stof calls
in its graphs and CUDA graphs capture them.

torch.ops.stof.attention(q, k, v, mask, seq_lens, scale, layout, softcap, alibi,
alibi_slopes, bias) runs the
same eager path as stof.attention; its fake (meta) implementation gives the
output's sizes and strides from q's alone. stof.attention calls the op by
itself while torch.compile traces. Imported only once torch is, by
_attention, which hands both over: this module knows nothing of it.
"""
from typing import Optional

import torch

from . import _mask

_done = []


def register(attention_torch, out_layout):
    """Defines the op over attention_torch (the eager path) and out_layout
    (an output's sizes and strides from q's)."""
    if _done:
        return
    _done.append(True)
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        return  # torch < 2.4: eager calls work; torch.compile breaks its graph at them

    @torch.library.custom_op("stof::attention", mutates_args=())
    def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: str,
                     seq_lens: Optional[torch.Tensor], scale: float,
                     layout: str, softcap: float = 0.0, alibi: bool = False,
                     alibi_slopes: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return attention_torch(q, k, v, _mask.from_op_key(mask), seq_lens, scale or None, layout,
                               softcap=softcap or None,
                               alibi=alibi_slopes if alibi_slopes is not None else alibi or None,
                               bias=bias)

    @attention_op.register_fake
    def _(q, k, v, mask, seq_lens, scale, layout, softcap=0.0, alibi=False, alibi_slopes=None,
          bias=None):
        shape, stride = out_layout(q.shape, q.stride(), layout)
        return q.new_empty_strided(shape, stride)


def call(q, k, v, mask, seq_lens, scale, layout, softcap=None, alibi=None, bias=None):
    """stof.attention while torch.compile traces: the op, with its arguments
    in the forms a schema takes (ALiBi as a flag and its slopes, if given)."""
    if seq_lens is not None and not isinstance(seq_lens, torch.Tensor):
        seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=q.device)
    slopes = alibi if isinstance(alibi, torch.Tensor) else None
    return torch.ops.stof.attention(q, k, v, _mask.op_key(mask), seq_lens,
                                    float(scale or 0.0), layout, float(softcap or 0.0),
                                    alibi is not None and alibi is not False, slopes, bias)
