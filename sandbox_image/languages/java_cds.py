"""Dump the class-data-sharing archive JJava's kernel starts from (run in the image build).

``python -I java_cds.py ARGFILE JAR ARCHIVE`` starts the kernel as ``init.py`` does (``java
@ARGFILE -jar JAR``) with ``-XX:ArchiveClassesAtExit=ARCHIVE``, runs a few cells of what a
session does (a value, printing, a method, a class, an error, a stream), and stops it with
SIGTERM, at which the JVM writes every class it loaded (JShell's and javac's included) to the
archive. A kernel started with ``-XX:SharedArchiveFile=ARCHIVE`` maps them instead of loading
and verifying them: it answers in about 0.9 s instead of 1.5 s, and holds about 10 MiB less.
An archive that does not match the JVM or the jar is ignored by the JVM (it loads as without).
"""

import os
import signal
import subprocess
import sys
import tempfile
import time

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

CELLS = (
    "int x = 2;\nx * 21",
    'System.out.println("x is " + x);',
    'String twice(String s) { return s + s; }\ntwice("ab")',
    "class Point { int x = 1; int y = 2; }\nnew Point().y",
    'throw new IllegalStateException("boom");',
    "java.util.List.of(3, 1, 2).stream().sorted().map(i -> i * 2).toList()",
)
READY_S = 120.0


def main(argfile: str, jar: str, archive: str) -> None:
    folder = tempfile.mkdtemp()
    connection, _ = write_connection_file(os.path.join(folder, "kernel.json"), ip="127.0.0.1",
                                          transport="tcp")
    kernel = subprocess.Popen(
        ["java", f"@{argfile}", f"-XX:ArchiveClassesAtExit={archive}", "-Xlog:cds=off",
         "-jar", jar, connection], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = BlockingKernelClient()
    client.load_connection_file(connection)
    client.start_channels(hb=False)
    deadline = time.monotonic() + READY_S
    while True:
        try:
            client.kernel_info(reply=True, timeout=1)
            break
        except TimeoutError:
            if kernel.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"the Java kernel did not answer (exit {kernel.poll()})")
    for cell in CELLS:
        client.execute_interactive(cell, timeout=60, output_hook=lambda _message: None)
    client.stop_channels()
    kernel.send_signal(signal.SIGTERM)  # the JVM writes the archive as it exits
    kernel.wait(timeout=120)
    if not os.path.isfile(archive):
        sys.exit(f"no archive at {archive}")
    os.chmod(archive, 0o444)


if __name__ == "__main__":
    main(*sys.argv[1:4])
