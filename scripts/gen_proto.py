"""Generate the Python API stubs from proto/inferix/v1/*.proto (what `make proto` runs).

protoc names modules after the proto package (`inferix.v1`); our stubs live in `inferix.api.v1`,
so imports between generated modules are rewritten. `--check` regenerates into a temporary
folder and fails if the committed stubs differ (CI runs it through the test suite).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_DIR = ROOT / "inferix" / "api" / "v1"
_IMPORT = re.compile(r"^from inferix\.v1 import", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "inferix" / "v1").glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for src in sorted((Path(tmp) / "inferix" / "v1").iterdir()):
            text = _IMPORT.sub("from inferix.api.v1 import", src.read_text())
            dst = out_dir / src.name
            dst.write_text(text)
            written.append(dst)
    (out_dir / "__init__.py").write_text(
        '"""Generated gRPC stubs of the inferix.v1 API (`make proto`); do not edit."""\n'
    )
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed stubs are out of date")
    args = parser.parse_args()
    if not args.check:
        for path in generate(OUT_DIR):
            print(path.relative_to(ROOT))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [p.name for p in fresh if not (OUT_DIR / p.name).is_file() or not filecmp.cmp(p, OUT_DIR / p.name)]
        extra = sorted(p.name for p in OUT_DIR.glob("*_pb2*.py*") if not (Path(tmp) / p.name).is_file())
    if stale or extra:
        print(f"generated stubs are out of date: {stale + extra}; run `make proto`", file=sys.stderr)
        return 1
    print("generated stubs match proto/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
