"""``replgate``: the command line (serve, mcp, image, audit)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def _image_build(args: argparse.Namespace) -> int:
    import docker

    from gateway.settings import Settings
    from kernel_pool.exceptions import KernelPoolError
    from kernel_pool.image import build_image

    settings = Settings()
    try:
        info = build_image(docker.from_env(), state_dir=Path(settings.state_dir), force=args.force,
                           log=lambda line: print(f"[replgate] {line}", file=sys.stderr))
    except KernelPoolError as exc:
        print(f"replgate: {exc}", file=sys.stderr)
        return 1
    print(f"{info.tag} {info.id} (base {info.base})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replgate", description="A hardened, persistent Python REPL for AI agents.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    image = commands.add_parser("image", help="build or inspect the sandbox image")
    image_commands = image.add_subparsers(dest="image_command", required=True, metavar="ACTION")
    build = image_commands.add_parser("build", help="build the sandbox image unless up to date")
    build.add_argument("--force", action="store_true", help="rebuild even when up to date")
    build.set_defaults(func=_image_build)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
