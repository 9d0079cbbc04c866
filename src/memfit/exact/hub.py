"""Download one file, config.json, from the Hugging Face Hub (nothing else, never weights).

``huggingface_hub`` is imported when the function runs, so the pure core can reach this module
lazily without paying for it on the catalog and local paths. The Hub's cache, token and offline
settings apply as usual (``HF_HOME``, ``HF_TOKEN``, ``HF_HUB_OFFLINE``): a config already in the
cache is found without network. Every failure becomes one ``MemfitError`` line.
"""

from __future__ import annotations

from memfit.errors import MemfitError

HUB_TIMEOUT_S = 5.0
"""How long memfit waits for the Hub to answer at all. huggingface_hub retries a failed connection
with backoff (1+2+4+8+8 s) before it falls back to its cache; memfit asks once, and without an
answer reads the cache only, so an offline machine gets its answer in seconds."""


def _hub_unreachable(repo_id: str, revision: str | None) -> bool:
    """One HEAD of the file's own URL, no retries: True when no answer comes (no network, DNS,
    timeout). Any HTTP answer, an error status included, means the Hub is there."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session
    from huggingface_hub.utils._http import _DEFAULT_RETRY_ON_EXCEPTIONS

    if constants.HF_HUB_OFFLINE:
        return True
    try:
        get_session().head(hf_hub_url(repo_id, "config.json", revision=revision), headers=build_hf_headers(),
                           timeout=HUB_TIMEOUT_S, follow_redirects=False)
    except _DEFAULT_RETRY_ON_EXCEPTIONS:
        return True
    except Exception:  # anything else: let hf_hub_download meet it and report it as usual
        return False
    return False


def download_config_json(repo_id: str, *, revision: str | None = None) -> str:
    """Local path of ``config.json`` of ``repo_id`` (from the Hub cache, downloading if needed)."""
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub import errors as hub_errors
    except ImportError as exc:
        raise MemfitError(
            f"{repo_id} is not in memfit's catalog and downloading its config.json needs "
            "huggingface_hub (pip install 'memfit[exact]')"
        ) from exc

    import logging

    at = f" at revision {revision}" if revision else ""
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its retry warnings would bury memfit's one-line error
    try:
        offline = _hub_unreachable(repo_id, revision)
        return hf_hub_download(repo_id, "config.json", revision=revision, etag_timeout=HUB_TIMEOUT_S,
                               local_files_only=offline)
    except hub_errors.GatedRepoError as exc:
        raise MemfitError(
            f"{repo_id} is gated on the Hugging Face Hub: accept its license on the model page "
            "and log in (hf auth login, or set HF_TOKEN)"
        ) from exc
    except hub_errors.RepositoryNotFoundError as exc:
        raise MemfitError(
            f"{repo_id} was not found on the Hugging Face Hub (wrong id, or private: log in)"
        ) from exc
    except hub_errors.RevisionNotFoundError as exc:
        raise MemfitError(f"{repo_id} has no revision {revision!r} on the Hub") from exc
    except hub_errors.LocalEntryNotFoundError as exc:
        raise MemfitError(
            f"cannot fetch config.json of {repo_id}{at}: the Hub is unreachable (no network or "
            "HF_HUB_OFFLINE) and it is not in the local Hugging Face cache"
        ) from exc
    except hub_errors.EntryNotFoundError as exc:
        raise MemfitError(f"{repo_id} has no config.json{at} on the Hub") from exc
    except hub_errors.HFValidationError as exc:
        raise MemfitError(f"{repo_id!r} is not a valid Hugging Face repo id") from exc
    except (hub_errors.HfHubHTTPError, OSError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MemfitError(f"cannot fetch config.json of {repo_id}{at}: {reason}") from exc
    finally:
        hub_log.setLevel(level)
