"""Where a bundle reference points: the single hook for remote and named bundles.

Today a reference is a local folder. The hub/zoo issue extends :func:`resolve_bundle_path` so that
``"hf://ORG/NAME@REVISION"`` downloads a snapshot (huggingface_hub) and a zoo name (``"tiny-bd"``)
looks up its repo id and revision; both return a local folder and every caller of
:func:`~dwise_predict.bundle.load_bundle` gets them for free.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BundleError
from .format import MANIFEST

HF_SCHEME = "hf://"


def resolve_bundle_path(ref: str | Path) -> Path:
    """A local bundle folder for ``ref`` (a path today; hub references and zoo names next)."""
    if isinstance(ref, str) and ref.startswith(HF_SCHEME):
        raise BundleError(f"cannot load {ref!r}: Hugging Face Hub references are not supported yet; "
                          "download the bundle with `huggingface-cli download` and pass its folder")
    path = Path(ref).expanduser()
    if not path.exists():
        raise BundleError(f"bundle {str(ref)!r} does not exist; pass the folder `dwise-predict train --out` wrote")
    if not path.is_dir():
        raise BundleError(f"bundle {str(ref)!r} is a file; a bundle is a folder with {MANIFEST}")
    if not (path / MANIFEST).is_file():
        raise BundleError(f"{path} has no {MANIFEST}; it is not a dwise-predict bundle")
    return path
