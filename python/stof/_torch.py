"""_torch: stof's torch.library custom ops, so torch.compile keeps stof calls
in its graphs and CUDA graphs capture them.

torch.ops.stof.attention(q, k, v, mask, seq_lens, scale, layout, softcap, alibi,
alibi_slopes, bias) runs the
same eager path as stof.attention; its fake (meta) implementation gives the
output's sizes and strides from q's alone. torch.ops.stof.attention_varlen(q,
k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, scale,
softcap) is the packed variable-length form; its output is like q,
contiguous. stof.attention calls the ops by itself while torch.compile
traces. Imported only once torch is, by _attention, which hands the eager
paths over: this module knows nothing of them.
"""
from typing import Optional

import torch

from . import _mask

_done = []


def register(attention_torch, out_layout, attention_varlen):
    """Defines the ops over attention_torch (the eager path), out_layout
    (an output's sizes and strides from q's) and attention_varlen (the
    varlen eager path)."""
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

    @torch.library.custom_op("stof::attention_varlen", mutates_args=())
    def attention_varlen_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                            max_seqlen_q: int, max_seqlen_k: int, mask: str, scale: float = 0.0,
                            softcap: float = 0.0) -> torch.Tensor:
        return attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                _mask.from_op_key(mask), scale or None, softcap=softcap or None)

    @attention_varlen_op.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, scale=0.0,
          softcap=0.0):
        return q.new_empty(q.shape)


def call(q, k, v, mask, seq_lens, scale, layout, softcap=None, alibi=None, bias=None):
    """stof.attention while torch.compile traces: the op, with its arguments
    in the forms a schema takes (ALiBi as a flag and its slopes, if given)."""
    if seq_lens is not None and not isinstance(seq_lens, torch.Tensor):
        seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=q.device)
    slopes = alibi if isinstance(alibi, torch.Tensor) else None
    return torch.ops.stof.attention(q, k, v, _mask.op_key(mask), seq_lens,
                                    float(scale or 0.0), layout, float(softcap or 0.0),
                                    alibi is not None and alibi is not False, slopes, bias)


def call_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, scale,
                softcap):
    """stof.attention's varlen form while torch.compile traces: the op."""
    return torch.ops.stof.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                           int(max_seqlen_q), int(max_seqlen_k),
                                           _mask.op_key(mask), float(scale or 0.0),
                                           float(softcap or 0.0))
