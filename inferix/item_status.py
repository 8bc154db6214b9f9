"""One item's outcome in a batched call (`ItemStatus`): what its own unary call would have ended with.

A batched call (PushBlocks, CommitBlocks) answers each item on its own, so a caller gets for its item
either a result or the error its unary call would have raised (`item_error`), with the same status
code: retries and fallbacks keyed on the code (UNAVAILABLE, OUT_OF_RANGE, ALREADY_EXISTS) work alike.
"""

from __future__ import annotations

import grpc

from inferix.api.v1 import common_pb2

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def item_status(code: grpc.StatusCode, message: str) -> common_pb2.ItemStatus:
    return common_pb2.ItemStatus(code=code.value[0], message=message)


def item_error(status: common_pb2.ItemStatus, method: str) -> grpc.aio.AioRpcError | None:
    """The item's error, as its unary call `method` would have raised it; None when it succeeded."""
    if status.code == 0:
        return None
    code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=status.message, debug_error_string=f"item of {method}"
    )
