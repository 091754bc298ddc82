"""A library that calls an API TorchTPU keeps to torch itself, told with the fix.

torch_tpu 0.2.0 guards part of ``torch.tpu`` (``is_available``, ``device_count``, ...): a
caller outside torch and torch_tpu gets ``RuntimeError: is_available is internal to TorchTPU
and can only be called by the PyTorch framework``. Libraries written for an earlier TorchTPU
call them: transformers up to 5.19 does in ``TrainingArguments`` (so every ``Trainer``)
wherever torch_tpu is installed, chip or not; 5.20 asks ``torch.accelerator`` instead. The
raw text names neither the library nor the fix; this does.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import traceback
from pathlib import Path

from tpunb.versions import distribution_version, release

_RESERVED = re.compile(
    r"(?P<api>\w+) is internal to TorchTPU and can only be called by the PyTorch framework"
)

#: The first release of a library that no longer calls TorchTPU's reserved API (measured).
FIXED_IN = {"transformers": (5, 20)}

#: Where the guard and the framework live: never the caller to blame.
_FRAMEWORK = ("torch", "torch_tpu")


def reserved_call_advice(error: BaseException) -> list[str]:
    """Lines naming the library that called a reserved ``torch.tpu`` API and what fixes it;
    empty for any other error."""
    found = _RESERVED.search(str(error))
    if found is None:
        return []
    api = f"torch.tpu.{found['api']}"
    caller = _calling_package(error)
    if caller is None:
        return [f"{api} is kept to torch itself by torch_tpu: the code that called it needs a newer release"]
    return [told(api, caller, distribution_version(_distribution(caller)))]


def told(api: str, caller: str, version: str | None) -> str:
    """What to say when ``caller`` at ``version`` called the reserved ``api``."""
    said = f"{caller} {version or '?'} called {api}, which torch_tpu keeps to torch itself"
    wanted = fixed_release(caller, version)
    if wanted is not None:
        upgrade = f"pip install -U '{caller}>={wanted}'"
        return f"{said}; {caller} >= {wanted} asks torch.accelerator instead: {upgrade}"
    return f"{said}: a newer {caller} may ask torch.accelerator instead (pip install -U {caller})"


def fixed_release(package: str, version: str | None) -> str | None:
    """The release of ``package`` that no longer calls the reserved API (``5.20``) where
    ``version`` predates it; None where it is fixed there or not known to call it."""
    fixed = FIXED_IN.get(package)
    if fixed is None or version is None or release(version)[:2] >= fixed:
        return None
    return ".".join(map(str, fixed))


def _calling_package(error: BaseException) -> str | None:
    """The top-level package of the innermost frame outside torch and torch_tpu: the caller."""
    packages = _package_roots()
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        package = _package_of(Path(frame.filename), packages)
        if package is not None and package not in _FRAMEWORK:
            return package
    return None


def _package_roots() -> list[Path]:
    """sys.path's folders, deepest first: site-packages is inside a prefix that may be there too."""
    roots = {Path(entry).resolve() for entry in sys.path if entry and Path(entry).is_dir()}
    return sorted(roots, key=lambda root: len(root.parts), reverse=True)


def _distribution(package: str) -> str:
    """The distribution that installs ``package`` (``sklearn`` -> ``scikit-learn``)."""
    return importlib.metadata.packages_distributions().get(package, [package])[0]


def _package_of(file: Path, roots: list[Path]) -> str | None:
    """``.../site-packages/transformers/utils/x.py`` -> ``transformers``; None outside a package."""
    resolved = file.resolve()
    for root in roots:
        if resolved.is_relative_to(root) and len(resolved.relative_to(root).parts) > 1:
            return resolved.relative_to(root).parts[0]
    return None
