"""Free a traced step's autograd graph one node at a time, never recursively.

Why: tracing tags every autograd node with its module (``grad_fn.metadata``, ``NodeTagger``), which
gives each node a Python object. A node whose last reference is its Python object is freed by
``THPCppFunction_dealloc``, and ``~Node`` drops its ``next_edges``, which frees the next node the
same way: the C stack grows by five frames per node of the longest path from the loss to a leaf
(torch's own iterative ``deleteNode`` is bypassed). A 1,024-layer llama traced at 32 tokens has a
path of about 50,000 nodes, which overflowed the 8 MiB main-thread stack (signal 11, no message;
issue 24 item 5); 128 layers did under a 1 MiB stack.

``release_graph`` holds every node reachable from the roots in a list ordered parents first, lets
the caller drop its tensors, then pops the list: each node dies when its entry goes, while its
children are still held by the list, so each free is one node deep.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def graph_nodes(roots: Iterable[torch.Tensor]) -> list[Any]:
    """Every autograd node reachable from ``roots``' ``grad_fn``, in post order (each node after all
    the nodes it leads to): popping from the end frees parents before their children. Iterative, so
    a graph of any depth is walked in constant stack."""
    order: list[Any] = []
    seen: set[int] = set()
    for t in roots:
        fn = getattr(t, "grad_fn", None)
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        stack = [(fn, iter(fn.next_functions))]
        while stack:
            node, children = stack[-1]
            for child, _ in children:
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child, iter(child.next_functions)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def release_nodes(order: list[Any]) -> None:
    """Drop the references ``graph_nodes`` took, parents first (see the module's docstring)."""
    while order:
        order.pop()
