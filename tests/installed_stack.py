"""The release lines of the libraries installed here, for the tests that compare memfit with them.

memfit plans the stack's releases (``memfit.core.stack``); a test that checks a plan against the
installed library's own code (a trace, a meta build, peft's counts) tells memfit that release, so both
sides are the same code: ``build_model_shape(..., transformers_line=TRANSFORMERS_LINE)``.
"""

from __future__ import annotations


def _transformers_line() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    from memfit.core.stack.releases import release_line

    return release_line("transformers", transformers.__version__, where="the installed transformers")


TRANSFORMERS_LINE = _transformers_line()
"""``major.minor`` of the installed transformers (``5.24``); None without it."""
