"""Per torch.distributed call: which tensors and parameters must agree across the group's ranks."""

from __future__ import annotations

from typing import Any, Callable

Peer = Callable[[dict[str, Any], str], Any]


def _t(value: Any) -> list[Any]:
    return [value] if value is not None else []


def _reduce_op(args: dict[str, Any]) -> dict[str, Any]:
    op = args.get("op")
    return {"op": _name(op)} if op is not None else {"op": "SUM"}


def _length(args: dict[str, Any], key: str) -> dict[str, Any]:
    value = args.get(key)
    try:
        return {key.replace("_list", "s"): len(value)}
    except TypeError:
        return {}


def _all_reduce(a: dict, peer: Peer) -> tuple:
    tensors = _t(a.get("tensor"))
    return tensors, tensors, _reduce_op(a)


def _broadcast(a: dict, peer: Peer) -> tuple:
    tensors = _t(a.get("tensor"))
    return tensors, tensors, {"src": peer(a, "src")}


def _reduce(a: dict, peer: Peer) -> tuple:
    return _t(a.get("tensor")), _t(a.get("tensor")), {"dst": peer(a, "dst"), **_reduce_op(a)}


def _all_gather(a: dict, peer: Peer) -> tuple:
    return _t(a.get("tensor")), _t(a.get("tensor")), _length(a, "tensor_list")


def _into_tensor(a: dict, peer: Peer) -> tuple:
    both = _t(a.get("input_tensor")) + _t(a.get("output_tensor"))
    return both, both, {}


def _gather(a: dict, peer: Peer) -> tuple:
    # gather_list exists only on the destination: not compared.
    return _t(a.get("tensor")), _t(a.get("tensor")), {"dst": peer(a, "dst")}


def _scatter(a: dict, peer: Peer) -> tuple:
    return _t(a.get("tensor")), _t(a.get("tensor")), {"src": peer(a, "src")}


def _reduce_scatter(a: dict, peer: Peer) -> tuple:
    return _t(a.get("output")), _t(a.get("output")), {**_length(a, "input_list"), **_reduce_op(a)}


def _reduce_scatter_tensor(a: dict, peer: Peer) -> tuple:
    both = _t(a.get("input")) + _t(a.get("output"))
    return both, both, _reduce_op(a)


def _all_to_all(a: dict, peer: Peer) -> tuple:
    # Uneven all_to_all is legal: per-rank shapes may differ, only dtypes and list lengths must agree.
    inputs = list(a.get("input_tensor_list") or ())
    return [], inputs[:1], {**_length(a, "input_tensor_list"), **_length(a, "output_tensor_list")}


def _all_to_all_single(a: dict, peer: Peer) -> tuple:
    uneven = a.get("output_split_sizes") is not None or a.get("input_split_sizes") is not None
    both = _t(a.get("input")) + _t(a.get("output"))
    return ([] if uneven else both), both, {"splits": uneven}


def _barrier(a: dict, peer: Peer) -> tuple:
    return [], [], {}


def _objects(key: str, root: str | None) -> Callable[[dict, Peer], tuple]:
    def describe(a: dict, peer: Peer) -> tuple:
        params = _length(a, key) if key else {}
        if root:
            params[root] = peer(a, root)
        return [], [], params
    return describe


def _p2p(root: str) -> Callable[[dict, Peer], tuple]:
    def describe(a: dict, peer: Peer) -> tuple:
        return _t(a.get("tensor")), _t(a.get("tensor")), {"peer": peer(a, root), "tag": int(a.get("tag") or 0)}
    return describe


def _p2p_objects(root: str) -> Callable[[dict, Peer], tuple]:
    def describe(a: dict, peer: Peer) -> tuple:
        return [], [], {"peer": peer(a, root), **_length(a, "object_list")}
    return describe


def _batch(a: dict, peer: Peer) -> tuple:
    ops = list(a.get("p2p_op_list") or ())
    tensors = [getattr(op, "tensor", None) for op in ops]
    kinds = [f"{getattr(getattr(op, 'op', None), '__name__', '?')}:{getattr(op, 'peer', '?')}" for op in ops]
    return [t for t in tensors if t is not None], [t for t in tensors if t is not None], {"ops": ",".join(kinds)}


OPS: dict[str, Callable[[dict, Peer], tuple]] = {
    "all_reduce": _all_reduce, "broadcast": _broadcast, "reduce": _reduce, "all_gather": _all_gather,
    "all_gather_into_tensor": _into_tensor, "gather": _gather, "scatter": _scatter,
    "reduce_scatter": _reduce_scatter, "reduce_scatter_tensor": _reduce_scatter_tensor,
    "all_to_all": _all_to_all, "all_to_all_single": _all_to_all_single, "barrier": _barrier,
    "broadcast_object_list": _objects("object_list", "src"), "all_gather_object": _objects("object_list", None),
    "gather_object": _objects("", "dst"), "scatter_object_list": _objects("scatter_object_output_list", "src"),
    "send": _p2p("dst"), "isend": _p2p("dst"), "recv": _p2p("src"), "irecv": _p2p("src"),
    "send_object_list": _p2p_objects("dst"), "recv_object_list": _p2p_objects("src"), "batch_isend_irecv": _batch,
}


def _name(value: Any) -> str:
    """A reduce op's name (RedOpType.SUM -> SUM; a PREMUL_SUM ReduceOp object -> its type)."""
    return str(getattr(value, "name", None) or type(value).__name__)


def describe(op: str, args: dict[str, Any], peer: Callable[[dict[str, Any], str], Any]) -> tuple[list, list, dict]:
    """(tensors whose shape must agree, tensors whose dtype/device must agree, other parameters).

    ``peer(args, "src")`` turns src / group_src into one global rank (the same root given either
    way is the same call).
    """
    spec = OPS.get(op)
    if spec is None:
        return [], [], {}
    return spec(args, peer)
