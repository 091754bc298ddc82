"""tpunb's JupyterLab extension, packaged for pip: the built assets live in ``labextension/``.

The Python side of the extension is in tpunb itself (``tpunb/labcomm.py``); this package
only tells JupyterLab where the prebuilt frontend is.
"""

try:
    from ._version import __version__
except ImportError:  # a source checkout that was never built or installed
    __version__ = "dev"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "tpunb-lab"}]
