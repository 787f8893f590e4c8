"""stof.hf: stof inside Hugging Face transformers models.

Importing it registers attn_implementation="stof" with transformers'
AttentionInterface, and its mask hook with AttentionMaskInterface, so
that a model hands stof its pattern (causal, sliding window, dense) and its
padding (as seq_lens) instead of a dense 4-D mask:

    import stof.hf
    model = AutoModel.from_pretrained(name, dtype=torch.float16, attn_implementation="stof")
    model.set_attn_implementation("stof")           # or later, on a loaded model
    with stof.hf.mask("window:256+global:64"):      # a spec of your own, for a block
        out = model(**batch)
    stof.hf.optimize(model.eval())                  # whole encoder layers, where stof has them

Needs torch and transformers (5.x; AttentionInterface came in 4.48, the
mask interface in 4.53). Grouped KV heads and the logit softcap go to stof
as they are; generate()'s decoding steps go to stof.decode (DynamicCache,
sliding-window caches and StaticCache, 1 to 16 new rows); calls stof cannot
run yet fall back to HF's sdpa and say so once: a step with left padding,
among others.
"""
try:
    import torch  # noqa: F401
    import transformers
    from transformers import AttentionInterface
except ImportError as e:
    raise ImportError("stof.hf needs torch and transformers (5.x, or 4.48 and later with "
                      "AttentionInterface): pip install torch transformers (%s)" % e) from e

from ._backend import ModelMask, attention, mask_hook
from ._masks import mask
from ._optimize import ENCODER_LAYERS, optimize

try:
    from transformers import AttentionMaskInterface
except ImportError:
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        AttentionMaskInterface = None

NAME = "stof"


def register():
    """Registers "stof" (done on import; again is harmless)."""
    AttentionInterface.register(NAME, attention)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(NAME, mask_hook)


register()

__all__ = ["attention", "mask_hook", "mask", "optimize", "register", "ModelMask",
           "ENCODER_LAYERS", "NAME"]
__transformers_version__ = transformers.__version__
