"""`inferix session ...`: drive sessions on a running mesh (see `inferix serve`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from inferix.errors import UserError
from inferix.spec.latency import LATENCY_CHOICES
from inferix_cli.scheduler_address import TLS_EPILOG, add_scheduler_address_arguments, print_waiting, retry_seconds


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "session",
        help="create, watch and control sessions on a running mesh",
        description="Talk to an Inferix scheduler (started by `inferix serve` or a cluster).",
        epilog=TLS_EPILOG,
    )
    add_scheduler_address_arguments(parser)
    parser.add_argument("--api-key", default=os.environ.get("INFERIX_API_KEY"), help="API key (env INFERIX_API_KEY)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per call")
    commands = parser.add_subparsers(dest="session_command", metavar="ACTION", required=True)

    create = commands.add_parser("create", help="create a session (prints its id)")
    create.add_argument("--prompt", help="the prompt from block 0 (text models; required by them)")
    create.add_argument("--prompt-at", action="append", default=[], metavar='BLOCK:"TEXT"')
    create.add_argument(
        "--image", type=Path, help="start image, PNG or JPEG (image-to-world models: Matrix-Game 2.0, with --blocks)"
    )
    create.add_argument("--model", default="toyworld", help="a model the workers serve (default toyworld)")
    create.add_argument("--blocks", type=int, default=0, help="blocks to generate (0 = until stopped)")
    create.add_argument("--seed", type=int, default=0)
    create.add_argument("--width", type=int, default=0)
    create.add_argument("--height", type=int, default=0)
    create.add_argument("--lookahead", type=int, default=0, help="blocks made ahead of playback (0 = the server's)")
    create.add_argument(
        "--latency",
        choices=LATENCY_CHOICES,
        default="smooth",
        help="interactive: for playing (smallest safe lookahead, adaptive jitter buffer, no browser playout delay; "
        "leave --lookahead 0); smooth (default): for watching (buffered). Never changes the frames",
    )
    create.add_argument("--wait", action="store_true", help="queue if no worker has room")
    create.add_argument(
        "--rtmp", action="store_true", help="also push it to the server's RTMP relay (prints the URL to play)"
    )
    create.add_argument("--watch", action="store_true", help="then watch it until it ends")

    for name, help_text in (
        ("watch", "print the session's events until it ends"),
        ("pause", "pause at the next block boundary"),
        ("resume", "resume a paused session"),
        ("stop", "finish at the next block boundary"),
        ("get", "print the session"),
        ("cancel", "cancel now"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("session_id")
    prompt = commands.add_parser("prompt", help="change the prompt at the next block boundary")
    prompt.add_argument("session_id")
    prompt.add_argument("text")
    prompt.add_argument("--recache", action="store_true", help="re-cache the KV cache under the new prompt (LongLive)")
    act = commands.add_parser(
        "act", help="hold keys / mouse from the next block boundary on (action-conditioned models, e.g. Matrix-Game)"
    )
    act.add_argument("session_id")
    act.add_argument("--keys", default="", help="keys held, by key or name, comma-separated (e.g. W,A); none: no key")
    act.add_argument(
        "--mouse", default="", help="one value per mouse axis of the model, comma-separated (e.g. 0.1,0); none: still"
    )
    listing = commands.add_parser("list", help="list your sessions")
    listing.add_argument("--state", action="append", default=[], help="only this state (repeatable)")
    download = commands.add_parser("download", help="save a finished session's MP4")
    download.add_argument("session_id")
    download.add_argument("out", type=Path)
    parser.set_defaults(func=run)


def _print_session(info: Any) -> None:
    print(
        f"{info.session_id}  {info.state:<9} blocks {info.blocks_done}"
        f"{'/' + str(info.num_blocks) if info.num_blocks else ''}  {info.model} {info.width}x{info.height}  "
        f"worker {info.worker_id or '-'}  prompt {info.current_prompt!r}"
        + ("  latency interactive" if info.latency == "interactive" else "")
        + (f"  error: {info.error}" if info.error else "")
    )
    for label, url in (("viewer", info.viewer_url), ("rtmp", info.rtmp_url)):
        if url:
            print(f"  {label}: {url}")
    schema = info.action_schema
    if schema is not None:
        keys = ", ".join(k.key or k.name for k in schema.keys) + (" (one at a time)" if schema.one_hot else "")
        axes = ", ".join(f"{a.name} [{a.minimum:g}, {a.maximum:g}]" for a in schema.mouse) or "none"
        print(f"  actions: keys {keys}; mouse {axes}")
        held = ", ".join(info.current_keys) or "none"
        print(f"  holding: keys {held}; mouse {', '.join(f'{m:g}' for m in info.current_mouse) or 'still'}")


def _watch(events: Any) -> int:
    from inferix.client import BlockDone, CommandAccepted, SessionError, StateChanged

    final = "unknown"
    for event in events:
        if isinstance(event, BlockDone):
            print(
                f"block {event.block_index:>4}  frames {event.first_frame}-{event.first_frame + event.num_frames - 1}"
                f"  {event.engine_ms:7.0f} ms  {event.worker_id}  {event.prompt!r}",
                flush=True,
            )
        elif isinstance(event, StateChanged):
            final = event.state
            print(f"state {event.state}: {event.reason}", flush=True)
        elif isinstance(event, CommandAccepted):
            print(f"{event.command} applies at block {event.applies_at_block}", flush=True)
        elif isinstance(event, SessionError):
            print(f"error {event.code}: {event.message}", file=sys.stderr, flush=True)
    return 0 if final in ("completed", "cancelled") else 1


def _command(client: Any, session_id: str, send: Any) -> int:
    """Send one command over an Interact stream and wait for its acceptance. Retried only while the
    scheduler refuses connections: a command that may have reached it is not sent twice."""
    from inferix.client.retry import retry_call

    def attempt() -> int:
        return _command_once(client, session_id, send)

    return retry_call(attempt, client.waiting(), idempotent=False)


def _command_once(client: Any, session_id: str, send: Any) -> int:
    from inferix.client import CommandAccepted, SessionError

    with client.interact(session_id, from_block=1 << 31) as interaction:
        send(interaction)
        for event in interaction.events():
            if isinstance(event, CommandAccepted):
                print(f"{event.command} applies at block {event.applies_at_block}")
                return 0
            if isinstance(event, SessionError):
                raise UserError(event.message)
    raise UserError("the session ended before the command was accepted")


def _mouse_values(text: str) -> list[float]:
    """`--mouse 0.1,0` as numbers (empty: a still mouse)."""
    try:
        return [float(value) for value in text.split(",")] if text.strip() else []
    except ValueError:
        raise UserError(f"--mouse: expected numbers separated by commas (e.g. 0.1,0), got {text!r}") from None


def run(args: argparse.Namespace) -> int:
    # Before gRPC loads: its own log lines of a failed handshake would bury the one-line error below.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    import grpc

    from inferix.client import Client, ReconnectPolicy, RecordingError, TlsError
    from inferix.spec import parse_prompt_schedule

    retry_s = retry_seconds(args)
    # `watch` waits longer by default: a scheduler resuming its sessions after a restart takes a while.
    watch_policy = ReconnectPolicy() if args.retry_s is None else ReconnectPolicy(args.retry_s)
    try:
        client = Client(
            args.server,
            api_key=args.api_key,
            timeout=args.timeout,
            tls=args.tls,
            ca=args.ca,
            retry=ReconnectPolicy(retry_s),
            on_wait=print_waiting,
        )
    except ValueError as exc:
        raise UserError(f"--server / --ca: {exc}") from None
    action = args.session_command
    try:
        if action == "create":
            if args.image is not None and not args.image.is_file():
                raise UserError(f"--image {args.image}: no such file")
            if args.prompt is None and args.prompt_at:
                raise UserError("--prompt-at: give the first prompt with --prompt too")
            prompts = (
                None
                if args.prompt is None
                else parse_prompt_schedule(args.prompt, args.prompt_at, num_blocks=args.blocks or None)
            )
            info = client.create_session(
                prompts,
                image=args.image,
                model=args.model,
                width=args.width,
                height=args.height,
                seed=args.seed,
                num_blocks=args.blocks,
                lookahead=args.lookahead,
                wait_for_capacity=args.wait,
                rtmp=args.rtmp,
                latency=args.latency,
            )
            # The id alone on stdout (`id=$(inferix session create ...)`); where to watch on stderr.
            print(info.session_id, flush=True)
            for label, url in (("viewer", info.viewer_url), ("rtmp", info.rtmp_url), ("mp4", info.mp4_url)):
                if url:
                    print(f"{label}: {url}", file=sys.stderr, flush=True)
            return _watch(client.events(info.session_id, reconnect=watch_policy)) if args.watch else 0
        if action == "watch":
            return _watch(client.events(args.session_id, reconnect=watch_policy))
        if action in ("get", "cancel"):
            info = client.get_session(args.session_id) if action == "get" else client.cancel_session(args.session_id)
            _print_session(info)
            return 0
        if action == "list":
            for info in client.list_sessions(args.state or None):
                _print_session(info)
            return 0
        if action == "download":
            info = client.get_session(args.session_id)
            print(client.download_recording(info, args.out))
            return 0
        if action == "act":
            keys = [key.strip() for key in args.keys.split(",") if key.strip()]
            mouse = _mouse_values(args.mouse)
            return _command(client, args.session_id, lambda i: i.act(keys, mouse))
        if action == "prompt":
            return _command(client, args.session_id, lambda i: i.set_prompt(args.text, args.recache))
        return _command(client, args.session_id, lambda i: getattr(i, action)())
    except TlsError as exc:
        raise UserError(exc.message) from None
    except RecordingError as exc:
        raise UserError(str(exc)) from None
    except grpc.RpcError as exc:
        code = exc.code()
        details = exc.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            waited = f" (retried for {retry_s:g} s; --retry-s)" if retry_s > 0 else ""
            raise UserError(
                f"no scheduler at {args.server}{waited}: start one with `inferix serve` or pass --server"
            ) from None
        raise UserError(f"{code.name}: {details}") from None
    finally:
        client.close()
