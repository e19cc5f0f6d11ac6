"""The denylist: the trust policy's second line (the first, positive, is :mod:`.trust`).

It names *families* -- modules and objects that run code, load other pickles or native code, spawn
processes, touch files or the network, or reach arbitrary attributes -- so that even a class, or an
explicit :class:`~.trust.UnsafeCallable`, from one of them is refused, under every spelling a full
unpickle may resolve a name to (:func:`~..core.names.pickle_forms`).  Pure string work, linear in the name.
"""

from __future__ import annotations

import functools
from typing import Optional

from ..names import pickle_forms

__all__ = ["denylist_reason", "reach_reason"]

_RUNS_PROCESSES = (
    "runs commands, signals or threads, or changes the process",
    "os posix nt _posixsubprocess subprocess commands popen2 pty sys signal threading _thread "
    "multiprocessing concurrent asyncio sched atexit ctypes _ctypes cffi resource fcntl termios tty "
    "curses readline rlcompleter _winapi msvcrt winreg _winreg platform webbrowser antigravity this "
    "gc faulthandler tracemalloc _signal _multiprocessing _posixshmem _tkinter tkinter _thread _threading_local "
    "_xxsubinterpreters _interpreters _interpchannels _interpqueues _testcapi _testinternalcapi _testbuffer "
    "_osx_support _aix_support uuid._get_command_stdout torch.utils.collect_env",
)
_RUNS_CODE = (
    "compiles, imports or runs code",
    "code codeop compileall py_compile runpy importlib imp _imp _frozen_importlib _frozen_importlib_external "
    "_bootstrap _bootstrap_external zipapp pkgutil zipimport site sysconfig _sysconfig _opcode opcode "
    "ensurepip venv distutils setuptools pip pkg_resources timeit pdb bdb cProfile profile pstats "
    "trace pydoc doctest unittest inspect dis types functools operator itertools copyreg copy_reg "
    "torch.fx torch.jit torch.package torch._dynamo torch._inductor torch.compiler torch.export "
    "torch._export torch.utils.cpp_extension torch.testing torch.library torch._library torch.ops "
    "torch._ops torch.classes torch._classes torch.distributed.rpc torch.multiprocessing "
    "torch._utils._import_dotted_name torch.hub torch.compile torch._C._aoti "
    "numpy.testing numpy.distutils numpy.f2py "
    "numpy.ctypeslib numpy.lib.utils numpy._utils",
)
_LOADS_DATA = (
    "loads another pickle, checkpoint, file or native library",
    "pickle _pickle cPickle marshal shelve dbm dill cloudpickle joblib yaml torch.load torch.save "
    "torch.serialization torch.storage._load_from_bytes torch._C._jit torch._C.import_ir_module _compression "
    "torch.PyTorchFileReader torch.PyTorchFileWriter torch._C.PyTorchFileReader torch._C.PyTorchFileWriter "
    "torch.utils.data.datapipes.utils.decoder "
    "torch._C._load_for_lite_interpreter numpy.load numpy.save numpy.savez numpy.savez_compressed "
    "numpy.loadtxt numpy.savetxt numpy.genfromtxt numpy.fromfile numpy.fromregex numpy.memmap "
    "numpy.DataSource numpy.lib.npyio numpy.lib._npyio_impl numpy.lib.format numpy.lib._format_impl "
    "numpy.lib._datasource numpy.lib.format.open_memmap",
)
_TOUCHES_FILES = (
    "opens, writes or deletes files",
    "io _io _pyio tempfile shutil pathlib glob posixpath ntpath genericpath fileinput filecmp gzip bz2 "
    "_bz2 lzma _lzma zipfile tarfile zlib mmap sqlite3 _sqlite3 _dbm _gdbm logging.config logging.handlers "
    "logging.FileHandler logging.basicConfig torch.cuda.gds",
)
_USES_NETWORK = (
    "fetches from or talks to the network",
    "socket _socket ssl select selectors socketserver urllib urllib2 urlparse httplib http ftplib "
    "smtplib poplib imaplib nntplib telnetlib xmlrpc requests _ssl torch._C._distributed_c10d "
    "torch._C._distributed_rpc torch._C._distributed_autograd torch.utils.data._utils.worker",
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


#: What, used by a constructor's or function's own code, makes calling it reach files, sockets,
#: processes, compilers or other pickles (narrower than the families: ``sys`` or ``inspect`` used by
#: a constructor reaches nothing, named by a pickle they do).
_REACHES: dict[str, str] = {}
for _why, _names in (
    (
        "runs processes, signals or native code",
        "os posix nt subprocess _posixsubprocess pty popen2 commands multiprocessing _multiprocessing ctypes "
        "_ctypes cffi signal _signal webbrowser _winapi msvcrt resource fcntl torch.utils.collect_env",
    ),
    (
        "compiles, imports or runs code",
        "code codeop compileall py_compile runpy importlib imp _imp _frozen_importlib _frozen_importlib_external "
        "pkgutil zipimport torch.utils.cpp_extension torch.hub torch.package torch.jit.load torch.jit._serialization "
        "torch._inductor torch._C._aoti torch.compile",
    ),
    (
        "loads another pickle, checkpoint or file",
        "pickle _pickle marshal shelve dbm dill cloudpickle joblib yaml torch.load torch.save "
        "torch.serialization.load torch.serialization.save torch.serialization._load torch.serialization._legacy_load "
        "torch.serialization._save torch.serialization._legacy_save torch.storage._load_from_bytes "
        "numpy.load numpy.save numpy.fromfile numpy.memmap numpy.lib.npyio numpy.lib._npyio_impl numpy.lib.format "
        "torch.PyTorchFileReader torch.PyTorchFileWriter",
    ),
    (
        "opens, writes or deletes files",
        "io.open io.FileIO _io.open _io.FileIO _pyio tempfile shutil glob zipfile tarfile gzip bz2 lzma mmap "
        "sqlite3 fileinput logging.FileHandler logging.handlers logging.config torch.cuda.gds",
    ),
    (
        "talks to the network",
        "socket _socket ssl _ssl select selectors socketserver urllib http ftplib smtplib poplib imaplib nntplib "
        "telnetlib xmlrpc requests torch._C._distributed_c10d torch.distributed.rpc",
    ),
):
    for _name in _names.split():
        _REACHES[_name] = _why


@functools.lru_cache(maxsize=4096)
def reach_reason(name: str) -> Optional[str]:
    """Why code that uses *name* (a module or a module's attribute) reaches files, sockets, processes,
    compilers or other pickles, or None."""
    prefix = ""
    for part in name.split("."):
        prefix = f"{prefix}.{part}" if prefix else part
        why = _REACHES.get(prefix)
        if why:
            return f"{prefix} {why}"
    if name.startswith(("builtins.", "__builtin__.")) and name.split(".", 1)[1] in _REACHING_BUILTINS:
        return f"{name} opens files or runs code"
    return None


_REACHING_BUILTINS = frozenset("open exec eval compile __import__ breakpoint input execfile".split())
