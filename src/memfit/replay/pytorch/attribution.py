"""Sizes read off torch's objects in the replays outside DeepSpeed (``pytorch.child``, ``pytorch.fsdp``): the
distinct storages behind a set of tensors, as an ``AttributedItem``; the optimizer's per-param state
tensors; bitsandbytes' quantized-weight tensors. (``attribution`` does the same for DeepSpeed's buffers.)
"""

from __future__ import annotations

from memfit.replay.measurement import AttributedItem


def storages_bytes(tensors) -> tuple[int, int]:
    """(bytes, count) of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        t = getattr(t, "_local_tensor", t)  # a DTensor's local shard
        try:
            st = t.untyped_storage()
            seen.setdefault(st.data_ptr(), st.nbytes())
        except RuntimeError:  # storage resized to zero (an FSDP unsharded param between uses)
            continue
    return sum(seen.values()), len(seen)


def _item(key: str, at: str, tensors) -> AttributedItem:
    tensors = [t for t in tensors if t is not None]
    nbytes, count = storages_bytes(tensors)
    dev = {str(t.device) for t in tensors}
    return AttributedItem(key=key, at=at, bytes=nbytes, count=count,
                          device=dev.pop() if len(dev) == 1 else ("none" if not dev else "mixed"))


def optimizer_state_tensors(opt) -> list:
    """Every per-param state tensor (bitsandbytes' shared quantization maps ``qmap1``/``qmap2``, which
    sit in each 8-bit param's state dict, are not per-param state and are left out)."""
    import torch

    out = []
    for st in opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k not in ("qmap1", "qmap2"):
                out.append(v)
    return out


def quant_tensors(model) -> list:
    """Every tensor bitsandbytes stores for the quantized weights: packed data, absmax, code,
    nested absmax/code/offset (4-bit), CB/SCB (8-bit)."""
    import torch

    out = []
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        qs = getattr(w, "quant_state", None)
        if qs is not None:
            out.append(w.data)
            for v in (qs.absmax, qs.code, getattr(qs, "offset", None)):
                if torch.is_tensor(v):
                    out.append(v)
            if getattr(qs, "state2", None) is not None:
                out += [qs.state2.absmax, qs.state2.code]
        elif type(w).__name__ == "Int8Params":
            out += [w.data, getattr(w, "SCB", None)]
    return out
