"""The denylist: the trust policy's second line (the first, positive, is :mod:`.trust`).

It names *families* -- modules and objects that run code, load other pickles or native code, spawn
processes, touch files or the network, or reach arbitrary attributes -- so that even a class, or an
explicit :class:`~.trust.UnsafeCallable`, from one of them is refused, under every spelling a full
unpickle may resolve a name to (:func:`~..core.names.pickle_forms`).  Pure string work, linear in the name.
"""

from __future__ import annotations

import functools
from typing import Optional

from ..core.names import pickle_forms

__all__ = ["denylist_reason"]

_RUNS_PROCESSES = (
    "runs commands, signals or threads, or changes the process",
    "os posix nt _posixsubprocess subprocess commands popen2 pty sys signal threading _thread "
    "multiprocessing concurrent asyncio sched atexit ctypes _ctypes cffi resource fcntl termios tty "
    "curses readline rlcompleter _winapi msvcrt winreg _winreg platform webbrowser antigravity this "
    "gc faulthandler tracemalloc",
)
_RUNS_CODE = (
    "compiles, imports or runs code",
    "code codeop compileall py_compile runpy importlib imp pkgutil zipimport site sysconfig "
    "ensurepip venv distutils setuptools pip pkg_resources timeit pdb bdb cProfile profile pstats "
    "trace pydoc doctest unittest inspect dis types functools operator itertools copyreg copy_reg "
    "torch.fx torch.jit torch.package torch._dynamo torch._inductor torch.compiler torch.export "
    "torch._export torch.utils.cpp_extension torch.testing torch.library torch._library torch.ops "
    "torch._ops torch.classes torch._classes torch.distributed.rpc torch.multiprocessing "
    "torch._utils._import_dotted_name torch.hub numpy.testing numpy.distutils numpy.f2py "
    "numpy.ctypeslib numpy.lib.utils numpy._utils",
)
_LOADS_DATA = (
    "loads another pickle, checkpoint, file or native library",
    "pickle _pickle cPickle marshal shelve dbm dill cloudpickle joblib yaml torch.load torch.save "
    "torch.serialization torch.storage._load_from_bytes torch._C._jit torch._C.import_ir_module "
    "torch._C._load_for_lite_interpreter numpy.load numpy.save numpy.savez numpy.savez_compressed "
    "numpy.loadtxt numpy.savetxt numpy.genfromtxt numpy.fromfile numpy.fromregex numpy.memmap "
    "numpy.DataSource numpy.lib.npyio numpy.lib._npyio_impl numpy.lib.format numpy.lib._format_impl "
    "numpy.lib._datasource numpy.lib.format.open_memmap",
)
_TOUCHES_FILES = (
    "opens, writes or deletes files",
    "io _io tempfile shutil pathlib glob posixpath ntpath genericpath fileinput filecmp gzip bz2 "
    "lzma zipfile tarfile zlib mmap sqlite3 logging.config logging.handlers logging.FileHandler "
    "logging.basicConfig",
)
_USES_NETWORK = (
    "fetches from or talks to the network",
    "socket _socket ssl select selectors socketserver urllib urllib2 urlparse httplib http ftplib "
    "smtplib poplib imaplib nntplib telnetlib xmlrpc requests",
)

_FAMILIES: dict[str, str] = {}
for _why, _names in (_RUNS_PROCESSES, _RUNS_CODE, _LOADS_DATA, _TOUCHES_FILES, _USES_NETWORK):
    for _name in _names.split():
        _FAMILIES[_name] = _why

#: Harmless classes inside a denied family.
_EXEMPT = frozenset({"types.SimpleNamespace"})
#: Parts that, between the first and the last, walk the pickle into a dangerous module
#: (``torch.serialization.os.system`` at protocol 4); the static resolution catches the rest by identity.
_WALK_INTO = frozenset(
    "os posix nt sys subprocess builtins shutil socket pickle marshal ctypes importlib runpy pty".split()
)

# builtins that run code, reach attributes, build classes or callables, or touch the outside world.
_DANGEROUS_BUILTINS = frozenset(
    "eval exec compile getattr setattr delattr hasattr __import__ open globals locals vars dir input "
    "breakpoint memoryview exit quit help copyright credits license print type super classmethod "
    "staticmethod property map filter iter next aiter anext function code method "
    "builtin_function_or_method module frame generator coroutine cell __build_class__ __loader__ "
    "__spec__".split()
)


@functools.lru_cache(maxsize=4096)  # a pure function of the string: judged once per name
def denylist_reason(name: str) -> Optional[str]:
    """Why the denylist refuses *name* (a valid dotted name) under any pickle spelling, or None."""
    for form in pickle_forms(name):
        reason = _deny_one(form)
        if reason:
            return reason if form == name else f"a full unpickle resolves it as {form}: {reason}"
    return None


def _deny_one(name: str) -> Optional[str]:
    if name in _EXEMPT:
        return None
    parts = name.split(".")
    for part in parts[1:]:
        if len(part) > 4 and part.startswith("__") and part.endswith("__"):
            return f"it reaches the interpreter's internals ({part})"
    if parts[0] in ("builtins", "__builtin__") and len(parts) >= 2 and parts[1] in _DANGEROUS_BUILTINS:
        return f"builtins.{parts[1]} runs code, reaches arbitrary attributes or builds callables"
    prefix = ""
    for part in parts:
        prefix = f"{prefix}.{part}" if prefix else part
        why = _FAMILIES.get(prefix)
        if why:
            return f"{prefix} {why}"
    for part in parts[1:-1]:
        if part in _WALK_INTO:
            return f"it walks into the module {part!r}"
    return None
