"""The sandbox's launcher: what each sandboxed child runs before the generated program.

In the child, before any program code (as root when the parent is root): namespaces (network, IPC,
mount), the minimal root file system (``pivot_root`` into a fresh tmpfs, see :func:`_jail`), joining
the run's cgroup, the rlimits, the privilege drop to the run's dedicated uid and the socket guard;
then it compiles ``prog.py`` and executes it in ``__main__`` in place, with the launcher's own names
removed, so the program finds the globals a plain ``python prog.py`` would give it.
argv: ``uid file_mb memory_mb rlimits... cgroup_name:hierarchies`` (``uid`` -1 when the parent is
not root; ``':'`` when the run has no cgroup). The setup runs here, in the child's own interpreter,
rather than in a ``preexec_fn``, which is unsafe in a multi-threaded parent.

**How it is started.** :func:`collab.sandbox.run` reads this file's *source* (``importlib.resources``,
so it works from a checkout and from an installed wheel alike) and starts
``python -I -S -B -c SOURCE ARGS``. Passing the text, not a path or ``-m collab.sandbox.launcher``,
keeps the property the launcher needs: the child imports nothing of collab and needs no file of the
checkout or of site-packages, neither to start (``-I -S`` leave both off ``sys.path``) nor after the
``pivot_root``, where they are absent; ``-m`` would need them on ``sys.path``, which would also put
them into the jail (every ``sys.path`` directory is exposed for the stdlib). Hence the rules of this
file: the standard library only, imported inside functions, which also keeps the program's
``globals()`` clean; no ``from __future__`` import (``compile`` would pass it on to the program); and
syntax that the oldest interpreter the sandbox may fall back to (``/usr/bin/python3``) reads.
"""


def _die(what, err):
    import os

    os.write(2, ("collab sandbox: setup failed: %s: %s\n" % (what, err)).encode())
    os._exit(125)


def _mount(libc, src, dst, fstype, flags, data=None):
    import ctypes
    import os

    def enc(s):
        return None if s is None else s.encode()

    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s: %s" % (dst, os.strerror(err)))


# mount(2) flags
RO, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, MOVE, REC = 1, 2, 4, 8, 32, 4096, 8192, 16384


def _mkpoint(root, path, isdir):
    import os

    if isdir:
        os.makedirs(root + path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        open(root + path, "a").close()


def _expose(libc, root, path, bound, masked):
    """``path`` read-only at the same place under ``root`` (a link as a link), unless already there."""
    import os

    def under(path, dirs):
        return any(path == d or path.startswith(d + "/") for d in dirs)

    if under(path, bound) and not under(path, masked) or os.path.lexists(root + path):
        return
    if os.path.islink(path):
        _mkpoint(root, os.path.dirname(path), True)
        os.symlink(os.readlink(path), root + path)
    elif os.path.exists(path):
        _mkpoint(root, path, os.path.isdir(path))
        _mount(libc, path, root + path, None, BIND | REC)
        _mount(libc, None, root + path, None, REMOUNT | BIND | RO | NOSUID | NODEV)
        bound.append(path)


def _expose_host(libc, root):
    """What the program may read of the host: ``/usr``, the interpreter's files, a few of ``/etc``."""
    import os
    import sys

    bound, masked = [], []
    for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        _expose(libc, root, d, bound, masked)
    if os.path.isdir("/usr/local"):  # local installs and tools: hidden, but for the interpreter's files
        _mount(libc, "tmpfs", root + "/usr/local", "tmpfs", NOSUID | NODEV, "size=64k,mode=755")
        masked.append("/usr/local")
    _expose(libc, root, sys.executable, bound, masked)
    for p in sys.path:
        _expose(libc, root, os.path.realpath(p), bound, masked)
    with open("/proc/self/maps") as f:  # libpython and friends, wherever they are
        for lib in {line.split(None, 5)[5].strip() for line in f if "/" in line}:
            if lib.startswith("/") and not lib.endswith("(deleted)"):
                _expose(libc, root, os.path.realpath(lib), bound, masked)
    for name in (
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "localtime",
        "timezone",
        "alternatives",
        "hosts",
        "nsswitch.conf",
        "os-release",
        "mime.types",
    ):
        _expose(libc, root, "/etc/" + name, bound, masked)


def _private(libc, root, uid, file_mb, workdir):
    """The jail's own files: ``passwd`` and ``group``, ``/dev``, the writable tmpfs mounts and ``/proc``."""
    import os

    _mkpoint(root, "/etc", True)
    with open(root + "/etc/passwd", "w") as f:
        f.write("root:x:0:0::/:/usr/sbin/nologin\n")
        f.write("sandbox:x:%d:%d::%s:/usr/sbin/nologin\n" % (uid, uid, workdir))
    with open(root + "/etc/group", "w") as f:
        f.write("root:x:0:\nsandbox:x:%d:\n" % uid)
    _mkpoint(root, "/dev", True)
    _mount(libc, "tmpfs", root + "/dev", "tmpfs", NOSUID | NOEXEC, "size=64k,mode=755")
    for name in ("null", "zero", "full", "random", "urandom"):
        _mkpoint(root, "/dev/" + name, False)
        _mount(libc, "/dev/" + name, root + "/dev/" + name, None, BIND)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink("/proc/self/fd/%d" % i, root + "/dev/" + name)
    os.symlink("/proc/self/fd", root + "/dev/fd")
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        _mkpoint(root, d, True)
        _mount(libc, "tmpfs", root + d, "tmpfs", NOSUID | NODEV, "size=%dm,mode=1777" % file_mb)
    _mkpoint(root, workdir, True)
    opts = "size=%dm,mode=700,uid=%d,gid=%d" % (4 * file_mb, uid, uid)
    _mount(libc, "tmpfs", root + workdir, "tmpfs", NOSUID | NODEV, opts)
    _mkpoint(root, "/proc", True)
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    # per-mount proc options since 5.8; before, hidepid would change the host's /proc as well
    opts = "hidepid=invisible" if release >= (5, 8) else None
    _mount(libc, "proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC, opts)


def _jail(libc, uid, file_mb, source):
    """``pivot_root`` into a fresh tmpfs holding what the program may see (the list: :mod:`collab.sandbox`)."""
    import ctypes
    import os

    workdir = new = os.getcwd()
    _mount(libc, "tmpfs", new, "tmpfs", NOSUID | NODEV, "size=1m,mode=755")
    _expose_host(libc, new)
    _private(libc, new, uid, file_mb, workdir)
    os.chdir(new)
    nr = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)  # SYS_pivot_root
    if nr is not None and libc.syscall(nr, b".", b".") == 0:
        if libc.umount2(b".", 2) != 0:  # MNT_DETACH the old root, stacked over the new one
            raise OSError(ctypes.get_errno(), "umount of the old root")
    else:  # no pivot_root (e.g. the root is initramfs): move the new root over / and chroot
        _mount(libc, ".", "/", None, MOVE)
        os.chroot(".")
    os.chdir("/")
    _mount(libc, None, "/", None, REMOUNT | BIND | RO | NOSUID | NODEV)
    os.chdir(workdir)
    with open("prog.py", "wb") as f:  # for tracebacks
        f.write(source)


def _isolate(libc, uid, file_mb, memory_mb, source):
    """New network, IPC and mount namespaces; in the last, the jail (as root only)."""
    import resource

    libc.unshare(0x40000000)  # CLONE_NEWNET: fresh namespace, only a loopback that is down
    if libc.unshare(0x08000000) == 0:  # CLONE_NEWIPC: SysV objects die with the run
        for name, value in (("shmall", (memory_mb << 20) // resource.getpagesize()), ("msgmni", 16)):
            try:
                with open("/proc/sys/kernel/" + name, "w") as f:
                    f.write(str(value))
            except OSError:
                pass
    # CLONE_NEWNS, then MS_REC|MS_PRIVATE so that no mount propagates out of the namespace
    if libc.unshare(0x00020000) == 0 and libc.mount(b"none", b"/", None, 16384 | 262144, None) == 0:
        try:
            _jail(libc, uid, file_mb, source)
        except OSError as e:
            _die("file system", e)


def _join_cgroup(arg):
    """Wait until the parent has moved this process into the run's cgroups (``arg``: name:hierarchies)."""
    import time

    cgroup, _, hierarchies = arg.rpartition(":")
    if not cgroup:
        return
    for _ in range(10000):
        with open("/proc/self/cgroup") as f:
            if sum(line.rstrip("\n").endswith("/" + cgroup) for line in f) >= int(hierarchies):
                return
        time.sleep(0.001)
    _die("cgroup", "not joined")


def _guard_socket():
    """Patch ``socket`` if and when the program imports it (importing it costs ~10 ms)."""
    import sys
    from importlib.machinery import PathFinder

    class SocketGuard:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "socket":
                return None
            spec = PathFinder.find_spec(name, path)
            load = spec.loader.exec_module

            def exec_module(module):
                load(module)

                def refuse(*args, **kwargs):
                    raise OSError(101, "network access is disabled in the sandbox")

                module.socket.connect = module.socket.connect_ex = module.socket.sendto = refuse
                module.create_connection = refuse

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, SocketGuard)


def _setup():
    """Everything before the program; returns the program compiled."""
    import os
    import resource
    import sys

    uid, file_mb, memory_mb, *limits = map(int, sys.argv[1:-1])
    with open("prog.py", "rb") as f:
        source = f.read()
    sys.executable = os.path.realpath(sys.executable)  # e.g. a venv's link, hidden below
    libc = None
    if uid >= 0:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        _isolate(libc, uid, file_mb, memory_mb, source)
    _join_cgroup(sys.argv[-1])
    for i, name in enumerate(("CORE", "CPU", "AS", "FSIZE", "NPROC", "NOFILE")):
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (limits[2 * i], limits[2 * i + 1]))
    if uid >= 0:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    _guard_socket()
    sys.argv[:] = ["prog.py"]
    return compile(source, "prog.py", "exec")


def _main():
    """Set up, then leave ``__main__`` as a plain ``python prog.py`` has it; returns the program."""
    program = _setup()
    scope = globals()
    for name in [n for n in scope if not (n.startswith("__") and n.endswith("__"))]:
        del scope[name]
    scope["__file__"], scope["__doc__"] = "prog.py", None
    return program


if __name__ == "__main__":
    exec(_main())
