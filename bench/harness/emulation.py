"""Run this project's Python on an emulated Arm CPU (qemu-user), to check the int kernels MLAS picks there.

ONNX Runtime chooses its integer GEMM by CPU features, so int8 numerics must be checked per CPU class. x86
classes run this venv's own Python under `qemu-x86_64 -cpu MODEL`; Arm needs an aarch64 Python and aarch64
wheels, which `build_arm_sysroot` puts in one folder (Debian arm64 packages unpacked with `dpkg -x`, the pinned
wheels of the runtime's import chain installed with `pip --platform`). qemu-user passes the host's
/proc/cpuinfo through, and ORT's cpuinfo library crashes parsing an x86 one, so an Arm one matching the model
is bound over it in a private mount namespace (`unshare -m`, needs root); the HWCAP bits MLAS dispatches on
come from the emulated CPU model itself.

    python -m bench.harness.emulation build-arm            # ~700 MB under $QUARL_ARM_SYSROOT or ~/.cache/quarl/arm-sysroot
    python -m bench.micro.kernel_forms --qemu-arm-cpus cortex-a72,neoverse-n1,max

Numerics only: emulated CPUs say nothing about speed, and an emulator can itself be wrong, so a result
here is evidence about a CPU class, not a measurement on its hardware.
"""
from __future__ import annotations

import argparse
import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSROOT_ENV = "QUARL_ARM_SYSROOT"

# qemu CPU model -> the /proc/cpuinfo "Features" and "CPU part" a Linux kernel prints for it.
ARM_CPUS: dict[str, tuple[str, str]] = {
    "cortex-a72": ("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid", "0xd08"),  # NEON only
    "neoverse-n1": ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop "
                    "asimddp ssbs", "0xd0c"),  # + dot product (sdot/udot)
    "max": ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp "
            "ssbs sve asimdfhm i8mm bf16 svei8mm", "0xd40"),  # + int8 matrix multiply (smmla/usmmla), SVE
}

# Debian arm64 packages for a working python3.11 (the interpreter, its stdlib and the C libraries it loads).
DEBIAN_PACKAGES = (
    "libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libuuid1 "
    "libncursesw6 libtinfo6 libreadline8 libdb5.3 libgdbm6 libnsl2 libtirpc3 libcrypt1 python3.11-minimal "
    "libpython3.11-minimal libpython3.11-stdlib python3.11 libkrb5-3 libgssapi-krb5-2 libk5crypto3 "
    "libkrb5support0 libcom-err2 libkeyutils1").split()

# What `quarl.runtimes` imports (jax is imported for the quantizers; the ONNX executor runs without it).
WHEELS = ("numpy", "onnx", "onnxruntime", "protobuf", "jax", "jaxlib", "ml_dtypes", "opt_einsum", "scipy",
          "typing_extensions", "flatbuffers", "packaging", "etils", "filelock", "cloudpickle")


X86_UNAVAILABLE = "needs qemu-user on an x86_64 host (Debian: apt-get install qemu-user) to emulate another CPU"


def x86_unavailable() -> str | None:
    """Why this venv's Python cannot run under an emulated x86 CPU here, or None when it can."""
    if platform.machine() != "x86_64" or shutil.which("qemu-x86_64") is None:
        return X86_UNAVAILABLE
    return None


def run_under_x86(cpu: str, args: list[str], timeout: float = 900, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run this venv's Python with `args` under `qemu-x86_64 -cpu cpu` (MLAS then dispatches on that CPU's
    CPUID, e.g. Haswell's AVX2 kernels), this repository on its path."""
    reason = x86_unavailable()
    if reason:
        raise RuntimeError(reason)
    return subprocess.run([shutil.which("qemu-x86_64"), "-cpu", cpu, sys.executable, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env=emulated_env(cpu))


def emulated_env(cpu: str) -> dict[str, str]:
    """The environment of a process under an emulated CPU: this repository on its path, marked as emulated, and no
    persistent JAX compilation cache (its executables are compiled for the host's CPU, not the emulated one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    return {**env, "PYTHONPATH": str(REPO), "QUARL_EMULATED_CPU": cpu}


def stderr_tail(proc: subprocess.CompletedProcess, lines: int = 5) -> str:
    """The last lines of an emulated run's stderr without qemu's warnings about CPU features it lacks."""
    kept = [ln for ln in proc.stderr.splitlines() if "TCG doesn't support" not in ln]
    return " | ".join(kept[-lines:])


def default_sysroot() -> Path:
    return Path(os.environ.get(SYSROOT_ENV) or Path.home() / ".cache" / "quarl" / "arm-sysroot")


def arm_python(root: Path) -> Path:
    return root / "sys" / "usr" / "bin" / "python3.11"


def arm_unavailable(root: Path | None = None) -> str | None:
    """Why Arm emulation cannot run here, or None when it can."""
    root = root or default_sysroot()
    if platform.machine() != "x86_64" or shutil.which("qemu-aarch64") is None:
        return "needs qemu-user (Debian: apt-get install qemu-user) on an x86_64 host"
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return "needs root and unshare(1) to give the emulated Python an Arm /proc/cpuinfo"
    if not arm_python(root).exists() or not (root / "site" / "onnxruntime").is_dir():
        return f"no Arm sysroot at {root} (python -m bench.harness.emulation build-arm)"
    if not _can_bind_cpuinfo():
        return "this sandbox does not allow a private mount namespace (unshare -m + mount --bind failed)"
    return None


@functools.lru_cache(maxsize=1)
def _can_bind_cpuinfo() -> bool:
    """Whether `unshare -m` and a bind mount over /proc/cpuinfo work here (root is not always enough)."""
    try:
        proc = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind /proc/version /proc/cpuinfo"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def _pinned(names: tuple[str, ...]) -> list[str]:
    """`name==version` from requirements.lock for each wheel, so the emulated runtime is the tested one."""
    lock = (REPO / "requirements.lock").read_text(encoding="utf-8")
    out = []
    for name in names:
        pattern = re.escape(name).replace("_", "[-_.]")
        m = re.search(rf"^({pattern})==([^\s;]+)", lock, re.IGNORECASE | re.MULTILINE)
        out.append(f"{name}=={m.group(2)}" if m else name)
    return out


def build_arm_sysroot(root: Path) -> Path:
    """Unpack Debian's arm64 python3.11 into `root/sys` and the pinned aarch64 wheels into `root/site`."""
    debs = root / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if "arm64" not in subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True,
                                     text=True, check=True).stdout.split():
        subprocess.run(["dpkg", "--add-architecture", "arm64"], check=True)
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "download", "-q", *[f"{p}:arm64" for p in DEBIAN_PACKAGES]], cwd=debs, check=True,
                   stdout=subprocess.DEVNULL)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), str(root / "sys")], check=True)
    platforms = [a for tag in ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64",
                               "manylinux_2_28_aarch64") for a in ("--platform", tag)]
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--upgrade",
                    "--target", str(root / "site"), *platforms, "--python-version", "3.11", "--implementation", "cp",
                    "--only-binary=:all:", *_pinned(WHEELS)], check=True)
    return root


def run_under_arm(cpu: str, args: list[str], root: Path | None = None, timeout: float = 900,
                  cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the aarch64 Python with `args` under `qemu-aarch64 -cpu cpu`, this repository on its path."""
    if cpu not in ARM_CPUS:
        raise ValueError(f"unknown Arm CPU model {cpu!r} (known: {', '.join(ARM_CPUS)})")
    root = root or default_sysroot()
    reason = arm_unavailable(root)
    if reason:
        raise RuntimeError(reason)
    features, part = ARM_CPUS[cpu]
    cpuinfo = root / f"cpuinfo-{cpu}"
    cpuinfo.write_text("".join(f"processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: {features}\nCPU implementer\t: "
                               f"0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: {part}\nCPU revision\t: "
                               f"0\n\n" for i in range(os.cpu_count() or 1)), encoding="utf-8")
    inner = " ".join(["mount --bind", _q(cpuinfo), "/proc/cpuinfo && exec", _q(shutil.which("qemu-aarch64")),
                      "-cpu", cpu, "-L", _q(root / "sys"), _q(arm_python(root)), *map(_q, args)])
    env = {**emulated_env(cpu), "PYTHONPATH": f"{REPO}{os.pathsep}{root / 'site'}", "PYTHONNOUSERSITE": "1"}
    return subprocess.run(["unshare", "-m", "sh", "-c", inner], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def _q(value: object) -> str:
    import shlex  # pylint: disable=import-outside-toplevel

    return shlex.quote(str(value))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.harness.emulation", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser("build-arm", help="build the aarch64 sysroot (Debian packages + pinned wheels)")
    build.add_argument("--root", default=None, help=f"folder (default: ${SYSROOT_ENV} or ~/.cache/quarl/arm-sysroot)")
    args = parser.parse_args(argv)
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None or os.geteuid() != 0:
        parser.exit(2, "bench.harness.emulation: error: build-arm needs root on a Debian-family system (apt-get, dpkg)\n")
    root = build_arm_sysroot(Path(args.root) if args.root else default_sysroot())
    print(f"Arm sysroot ready: {root} ({arm_unavailable(root) or 'usable'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
