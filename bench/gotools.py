"""The benchmarks' Go load generators: built with Debian's Go on first use, run as children.

Why Go: a load generator in Python measures itself as much as the system under load,
and on a 2-core machine its CPU is taken from the servers.  NATS's publisher
(``bench/nats_pub``) and raftmq's (``bench/remoting_pub``) are both small Go programs
built the same way, so the generators' costs in one run are comparable.

How they are built: ``go build`` of ``bench/<name>/main.go`` in GOPATH mode against
``bench/gopath`` (what the tools share, ``raftmqbench/...``) and ``/usr/share/gocode``,
where Debian's ``golang-*-dev`` packages put their source, so no Go module is fetched
at build or run time.  The binary goes into ``~/.cache/raftmq-bench``, named by a hash
of its source and the shared source, so an edit is never stale and a second run builds
nothing.

How they run: each prints one JSON object on stdout and exits; a failure is a non-zero
status with the reason on stderr (``raftmqbench/report``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where Debian's golang-*-dev packages put their source; the tools build against it.
GOPATH = Path("/usr/share/gocode")
#: The Go packages the tools share, a GOPATH tree of its own.
SHARED_GOPATH = Path(__file__).resolve().with_name("gopath")
GO_PACKAGE = "golang-go"
#: Loaded before any fork: a child between fork and exec should do as little as it can.
_LIBC = ctypes.CDLL(None, use_errno=True)


def cache_dir() -> Path:
    """Where built tools live: outside the repository, kept between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "raftmq-bench"


def die_with_parent() -> None:
    """Runs in a child before exec: the kernel SIGKILLs it when the thread that started
    it exits, so a benchmark killed without its `finally` running leaves no server or
    generator behind.  Every child is started and reaped within one call on one thread,
    so no thread exits under one."""
    _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def apt_install(packages: tuple[str, ...]) -> None:
    """Install Debian packages (the benchmark machines give root)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        # A stale package list is the usual cause; refreshing it costs time, so only now.
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)


def run_tool(binary: Path, args: list[str], timeout_s: float, during=None) -> dict[str, Any]:
    """Run a built tool to completion and return the JSON it prints; ``during(pid)``, if
    given, runs while the tool does (it samples the processes' CPU)."""
    cmd = [str(binary), *args]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=die_with_parent,
    )
    try:
        if during is not None:
            during(proc.pid)
        stdout, stderr = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {stderr.strip()}")
    return json.loads(stdout)


def shared_digest() -> hashlib._Hash:
    """A hash of the shared Go packages' source, which every tool's binary name covers."""
    digest = hashlib.sha256()
    for shared in sorted(SHARED_GOPATH.rglob("*.go")):
        digest.update(shared.read_bytes())
    return digest


@dataclass(frozen=True)
class GoTool:
    """``bench/<name>/main.go`` and what its build needs besides the Go toolchain:
    ``sources`` maps a directory under GOPATH to the Debian package that provides it."""

    name: str
    sources: tuple[tuple[str, str], ...] = ()

    @property
    def source(self) -> Path:
        return Path(__file__).resolve().with_name(self.name) / "main.go"

    def binary(self) -> Path:
        """The built tool, named by its sources' hash so that an edit is never stale."""
        digest = shared_digest()
        digest.update(self.source.read_bytes())
        return cache_dir() / f"{self.name}-{digest.hexdigest()[:12]}"

    def missing(self) -> str | None:
        """None when the tool is built or can be, else what its build lacks."""
        if self.binary().exists():
            return None
        if shutil.which("go") is None:
            return f"no Go toolchain to build bench/{self.name} (apt-get install {GO_PACKAGE})"
        for directory, package in self.sources:
            if not (GOPATH / directory).is_dir():
                return f"no {GOPATH / directory} (apt-get install {package})"
        return None

    def ensure(self) -> Path:
        """The built tool: installs the Debian packages its build lacks and builds it.

        Idempotent and quick once built; raises (OSError, CalledProcessError,
        RuntimeError) when neither the tool nor what builds it can be had."""
        if self.missing():
            apt_install((GO_PACKAGE, *(package for _, package in self.sources)))
        return self.build()

    def build(self) -> Path:
        """Build into the cache (written under a temp name, then renamed) unless built."""
        out = self.binary()
        if out.exists():
            return out
        missing = self.missing()
        if missing:
            raise RuntimeError(missing)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        gopath = f"{SHARED_GOPATH}{os.pathsep}{GOPATH}"
        env = {**os.environ, "GO111MODULE": "off", "GOPATH": gopath}
        try:
            subprocess.run(["go", "build", "-o", str(tmp), str(self.source)], env=env, check=True)
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out

    def run(self, args: list[str], timeout_s: float, during=None) -> dict[str, Any]:
        """`run_tool` of the built tool."""
        return run_tool(self.build(), args, timeout_s, during)


@dataclass(frozen=True)
class GoModule:
    """``bench/<name>/``, a Go module of its own (``go.mod`` and ``go.sum`` committed)
    built in module mode: for a peer that is someone else's Go library, such as Apache
    RocketMQ's Go client, fetched from the Go module proxy at the versions ``go.sum``
    pins (once; Go's module cache keeps them). Built into the cache like a GoTool. A module
    may use the shared packages (``raftmqbench/report``) through a ``replace`` to
    ``../gopath/src/...`` in its go.mod."""

    name: str

    @property
    def directory(self) -> Path:
        return Path(__file__).resolve().with_name(self.name)

    def binary(self) -> Path:
        """The built program, named by a hash of the module's files and the shared ones."""
        digest = shared_digest()
        for path in sorted([*self.directory.glob("*.go"), self.directory / "go.mod",
                            self.directory / "go.sum"]):  # fmt: skip
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        return cache_dir() / f"{self.name}-{digest.hexdigest()[:12]}"

    def build(self) -> Path:
        """Build into the cache unless built; raises RuntimeError without a Go toolchain,
        CalledProcessError when the build fails (a module the proxy did not serve)."""
        out = self.binary()
        if out.exists():
            return out
        if shutil.which("go") is None:
            raise RuntimeError(
                f"no Go toolchain to build bench/{self.name} (apt-get install {GO_PACKAGE})"
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        env = {**os.environ, "GO111MODULE": "on", "GOFLAGS": "-mod=readonly -buildvcs=false"}
        try:
            subprocess.run(
                ["go", "build", "-o", str(tmp), "."], cwd=self.directory, env=env, check=True
            )
            os.replace(tmp, out)
        finally:
            tmp.unlink(missing_ok=True)
        return out

    def run(self, args: list[str], timeout_s: float, during=None) -> dict[str, Any]:
        """`run_tool` of the built program."""
        return run_tool(self.build(), args, timeout_s, during)


if __name__ == "__main__":  # python -m bench.gotools NAME: build bench/NAME (a Go module)
    import sys

    print(GoModule(sys.argv[1]).build())
