"""``tiny-bd``: the project's own small block-diffusion LM (LLaDA2-style), trained on CPU.

No real dLLM weights can be downloaded here, and a random model denoises without structure,
so the project ships a small model whose confidence (and so its denoising rounds) really
varies with how hard a request is. It is the embedded default of ``make demo``.

Importing this package needs torch (it is a feature package, not the light core); the
tokenizer alone (:mod:`.tokenizer`) does not.
"""

from .config import TinyBDConfig

__all__ = ["TinyBDConfig"]
