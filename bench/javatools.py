"""Apache RocketMQ's Java pieces, resolved from Maven Central, as test peers and anchors.

raftmq has no Java in it; its tests and benchmarks drive RocketMQ's own Java client (and,
later, its brokers) to check what raftmq claims about compatibility and speed against
the code most RocketMQ users run.

How they are had: `bench/java/pom.xml` names the artifacts; `mvn dependency:copy-dependencies`
copies them, with everything they depend on, into a directory of the cache
(``~/.cache/raftmq-bench/java-<hash>/lib``), and ``javac`` compiles the drivers beside the
pom (`bench/java/*.java`, e.g. `Peer.java`) into ``classes`` there. The directory is named
by a hash of the pom and the drivers, so an edit is never stale and a second run resolves
and compiles nothing; it appears whole or not at all (built under a temporary name, then
renamed). `.ci/run` warms it (``python -m bench.javatools``), so the tests do not pay for
Maven.

How they run: ``java -cp lib/*:classes <Main> ...`` (`JavaTool.command`), each a process
of its own that prints JSON lines, as the C++ client's and ali-ons' drivers do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.gotools import cache_dir

JAVA_DIR = Path(__file__).resolve().with_name("java")
#: rocketmq.home.dir for RocketMQ's tools and servers: their logging configuration (conf/).
ROCKETMQ_HOME = JAVA_DIR / "home"
#: RocketMQ's 4.9 name server and broker (no drivers of ours).
SERVER_POM = JAVA_DIR / "server" / "pom.xml"
#: RocketMQ 5.3's name server, broker, controller and proxy (no drivers of ours).
SERVER5_POM = JAVA_DIR / "server5" / "pom.xml"
#: RocketMQ's 5.x gRPC client and its driver (Client5Peer.java), through a proxy.
CLIENT5_POM = JAVA_DIR / "client5" / "pom.xml"
#: RocketMQ 5.3.3's mqadmin, for its controller verbs.
TOOLS5_POM = JAVA_DIR / "tools5" / "pom.xml"
# Java 17 runs RocketMQ 4.9's client; these opens let its classes reach the JDK internals
# RocketMQ 4.9 uses (direct buffers' cleaners), harmless where unused.
JVM_FLAGS = (
    "-Xms64m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",  # start-up over peak speed: a peer runs seconds
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
)


def missing_tools() -> str | None:
    """None when Java and Maven are installed, else which is not."""
    for command, package in (
        ("java", "openjdk-17-jre-headless"),
        ("javac", "openjdk-17-jdk-headless"),
        ("mvn", "maven"),
    ):
        if shutil.which(command) is None:
            return f"no {command} (apt-get install {package})"
    return None


@dataclass(frozen=True)
class JavaTool:
    """The artifacts of `bench/java/pom.xml` and the drivers compiled against them."""

    pom: Path = JAVA_DIR / "pom.xml"

    def sources(self) -> list[Path]:
        """The drivers beside the pom, with what they share (java/common), if any."""
        drivers = sorted(self.pom.parent.glob("*.java"))
        return [*drivers, *sorted((JAVA_DIR / "common").glob("*.java"))] if drivers else []

    def home(self) -> Path:
        """The built directory, named by a hash of the pom and the drivers."""
        digest = hashlib.sha256(self.pom.read_bytes())
        for source in self.sources():
            digest.update(source.name.encode() + b"\0" + source.read_bytes())
        return cache_dir() / f"java-{digest.hexdigest()[:12]}"

    def build(self) -> Path:
        """Resolve and compile into the cache unless done; raises RuntimeError naming
        what is missing, CalledProcessError when Maven or javac fails."""
        home = self.home()
        if home.exists():
            return home
        missing = missing_tools()
        if missing:
            raise RuntimeError(missing)
        tmp = home.with_name(f"{home.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            subprocess.run(
                ["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(self.pom),
                 "dependency:copy-dependencies", f"-DoutputDirectory={tmp / 'lib'}"],
                check=True, stdout=sys.stderr,
            )  # fmt: skip
            (tmp / "classes").mkdir()
            if self.sources():
                subprocess.run(
                    ["javac", "-nowarn", "-d", str(tmp / "classes"), "-cp", f"{tmp / 'lib'}/*",
                     *map(str, self.sources())],
                    check=True, stdout=sys.stderr,
                )  # fmt: skip
            os.replace(tmp, home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return home

    def command(
        self,
        main: str,
        *args: object,
        properties: dict[str, str] | None = None,
        jvm_flags: tuple[str, ...] = JVM_FLAGS,
    ) -> list[str]:
        """The command line running `main` (a class of the drivers) with `args`."""
        home = self.build()
        properties = {"rocketmq.home.dir": str(ROCKETMQ_HOME), **(properties or {})}
        defines = [f"-D{key}={value}" for key, value in properties.items()]
        classpath = f"{home / 'lib'}/*{os.pathsep}{home / 'classes'}"
        return ["java", *jvm_flags, *defines, "-cp", classpath, main, *map(str, args)]


if __name__ == "__main__":
    print(JavaTool().build())
    print(JavaTool(SERVER_POM).build())
    print(JavaTool(SERVER5_POM).build())
    print(JavaTool(CLIENT5_POM).build())
    print(JavaTool(TOOLS5_POM).build())
