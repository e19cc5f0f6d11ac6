"""The library's probes of torch: each answer is what a real ``torch.load`` does, another release's
behaviour (a stand-in) is read right, and a probe that cannot run makes the prediction unknown.

Every rule the model replays (:mod:`torch_serial_testing.unpickler`, :mod:`torch_serial_testing.modes`;
what a TorchScript archive meets and how the switches are spelt: the tools' :mod:`.tools.facts`) is
learnt by feeding torch's real weights-only unpickler a pickle of a few opcodes, or
``torch.serialization.load`` a canary checkpoint.  These tests check those answers against real
``torch.load`` calls on checkpoints made here (never against the probes' own pickles, never against
torch's source text); replace torch's behaviour by stand-ins of other releases (:mod:`other_torches`)
and check the probes report them; and make probes fail, which must turn the affected predictions
unknown, never a guess.
"""

from __future__ import annotations

import ast
import collections
import inspect
import io
import linecache
import pickle
import re
import tokenize
import unittest
import warnings
from typing import Any, Optional
from unittest import mock

import torch

import torch_serial_testing as tst
from test.helpers.other_torches import (
    APPEND_TARGETS,
    FORCE_NO_WO,
    FORCE_WO,
    RaisingUnpickler,
    Torch26Spelling,
    Torch28Persid,
    Torch28Setitem,
    Torch2141Append,
    forget_probes,
    load_standin,
    saved,
    switch_reader,
    torch_zip_of,
    unpickler_standin,
)
from test.helpers.roundtrip_fixtures import clean_env
from torch_serial_testing import Checkpoint, modes, predict, tools, unpickler
from torch_serial_testing import checkpoint as checkpoint_module
from torch_serial_testing.errors import CheckpointFormatError, ConflictingEnvironmentError, UnexpectedLoadOutcome
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.registry import allowlisted
from torch_serial_testing.tools import facts
from torch_serial_testing.tools.formats import FileCheckpoint
from torch_serial_testing.unpickler import (
    ContainerRule,
    PersidRules,
    global_refusal,
    unpickler_rules,
)

#: SETITEM(S) targets as torch's checks tell them apart (the dict kinds, then APPEND_TARGETS' "other" ones).
SETITEM_TARGETS = ("dict", "ordered_dict", "counter", "dict_subclass", "allowlisted_dict_subclass", *APPEND_TARGETS[3:])

# -- objects torch.save writes container opcodes for, onto targets of every kind ----------------------


class Items(list):
    """A list subclass."""


class Table(dict):
    """A dict subclass."""


class Other:
    """Neither a list nor a dict; takes list and dict items."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def append(self, item: Any) -> None:
        self.got.append(item)

    def extend(self, items: Any) -> None:
        self.got.extend(items)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.got.append((key, value))


class Slotted:
    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a = 1


class SlottedChild(Slotted):
    """Slots from its base, a ``__dict__`` of its own: state ``(dict or None, slotstate)``."""


class SlottedWithSetstate:
    __slots__ = ("a",)

    def __getstate__(self) -> dict:
        return {"a": 1}

    def __setstate__(self, state: dict) -> None:
        self.a = state["a"]


class Plain:
    def __init__(self) -> None:
        self.w = 1


def make_items() -> Items:
    return Items()


def make_table() -> Table:
    return Table()


def make_other() -> Other:
    return Other()


class Pickled:
    """Pickled as ``make_<kind>()`` then *n* list items or dict items: APPEND(S) / SETITEM(S) onto
    an object of that kind, whose type needs allowlisting only where the test allowlists it."""

    def __init__(self, factory: Any, n: int, dict_items: bool) -> None:
        self.factory, self.n, self.dict_items = factory, n, dict_items

    def __reduce__(self) -> Any:
        items = [(str(i), i) for i in range(self.n)] if self.dict_items else list(range(self.n))
        return (
            self.factory,
            (),
            None,
            None if self.dict_items else iter(items),
            iter(items) if self.dict_items else None,
        )


#: kind -> (factory, its type, opcode family).  "list"/"dict" are built by torch.save itself.
TARGETS = {
    "list_subclass": (make_items, Items, "APPEND"),
    "dict_subclass": (make_table, Table, "SETITEM"),
    "other": (make_other, Other, "both"),
}


def torch_load(data: bytes, allow: list[Any], **kwargs: Any) -> tuple[bool, str, str]:
    """(loaded, exception type, message) of a real weights-only torch.load with *allow* allowlisted."""
    try:
        with allowlisted(allow):
            torch.load(io.BytesIO(data), weights_only=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - torch's answer
        return False, type(e).__name__, str(e)
    return True, "", ""


def opcode_data(factory: Any, opcode: str, tag: int) -> bytes:
    """A checkpoint of ``{"x": <factory()> + items, "tag": tag}`` whose items go by *opcode*."""
    n = 1 if opcode in ("APPEND", "SETITEM") else 2
    return saved({"x": Pickled(factory, n, opcode.startswith("SETITEM")), "tag": tag})


class TestAnswersAreWhatTorchLoadDoes(unittest.TestCase):
    """On this torch, every probed rule is what a real torch.load does with a checkpoint."""

    def test_container_rules(self) -> None:
        rules = unpickler_rules()
        compared = 0
        for opcode in ("APPEND", "APPENDS", "SETITEM", "SETITEMS"):
            rule: Optional[ContainerRule] = rules.containers[opcode]
            for kind, (factory, cls, family) in TARGETS.items():
                if family != "both" and not opcode.startswith(family):
                    continue
                for listed in (False, True):
                    allow = [factory, cls] if listed else [factory]
                    target = f"allowlisted_{kind}" if listed else kind
                    self.assertIn(target, APPEND_TARGETS if opcode.startswith("APPEND") else SETITEM_TARGETS)
                    with self.subTest(opcode=opcode, target=target):
                        data = opcode_data(factory, opcode, compared)
                        loaded, etype, message = torch_load(data, allow)
                        compared += 1
                        refused = rule is not None and target in rule.refused
                        self.assertEqual(loaded, not refused, message)
                        if refused:
                            self.assertEqual(etype, "UnpicklingError")
                            self.assertIn(rule.message + repr(cls), message)
        self.assertEqual(compared, 16)
        # exactly a list and exactly a dict (and torch's own OrderedDict, Counter) are never refused
        for obj in ([1], [1, 2], {"a": 1}, {"a": 1, "b": 2}, collections.OrderedDict(a=1), collections.Counter("ab")):
            with self.subTest(type(obj).__name__, n=len(obj)):
                self.assertEqual(torch_load(saved(obj), [])[0], True)

    def test_persistent_id_rules(self) -> None:
        persid: PersidRules = unpickler_rules().persid
        ids = {"int": (b"K\x05", int), "other": (b"X\x03\x00\x00\x00abc", str)}
        for kind, (pid, cls) in ids.items():
            with self.subTest(kind):
                loaded, etype, message = torch_load(torch_zip_of(b"\x80\x02" + pid + b"Q."), [])
                self.assertFalse(loaded)  # a bare id is no storage: torch.load's own persistent_load fails
                refused = etype == "UnpicklingError" and persid.type_message in message
                self.assertEqual(refused, kind in persid.refused, message)
                if refused:
                    self.assertIn(persid.type_message + repr(cls), message)
        loaded, etype, message = torch_load(torch_zip_of(b"\x80\x02X\x06\x00\x00\x00module\x85Q."), [])
        self.assertEqual(etype, "UnpicklingError")
        self.assertIn(persid.storage_message + (repr(str) if persid.names_type else "module"), message)

    def test_build_rules(self) -> None:
        build = unpickler_rules().build
        self.assertEqual(torch_load(saved(SlottedWithSetstate()), [SlottedWithSetstate])[0], True)
        # a (None, slotstate) pair: loads only where BUILD splits it
        self.assertEqual(torch_load(saved(Slotted()), [Slotted])[0], build.splits_slotstate)
        # an instance with a __dict__ and slots, state ({}, slots): the same
        self.assertEqual(torch_load(saved(SlottedChild()), [SlottedChild])[0], build.splits_slotstate)
        self.assertTrue(torch_load(saved(Plain()), [Plain])[0])
        # a falsy state on a slotted instance: skipped, or fed to __dict__.update (which it lacks)
        data = torch_zip_of(b"\x80\x02c" + f"{Slotted.__module__}\nSlotted\n".encode() + b")\x81}b.")
        self.assertEqual(torch_load(data, [Slotted])[0], build.skips_falsy_state)
        # BUILD on a type only torch's own allowlist has (torch.Size)
        data = torch_zip_of(b"\x80\x02ctorch\nSize\n)R}b.")
        self.assertEqual(torch_load(data, [])[0], build.torch_types_buildable)

    def test_refusal_prefixes(self) -> None:
        rules = unpickler_rules()
        glob = f"c{__name__}\n".encode()
        cases = {
            "BUILD": (glob + b"make_other\n)R}b.", [make_other], rules.build_refusal + repr(Other)),
            "NEWOBJ": (glob + b"other_class\n)R)\x81.", [other_class], rules.newobj_refusal + repr(Other)),
            "REDUCE": (glob + b"unlisted\n)R)R.", [unlisted], rules.reduce_refusal + repr(_unlisted)),
        }
        for opcode, (body, allow, expected) in cases.items():
            with self.subTest(opcode):
                loaded, etype, message = torch_load(torch_zip_of(b"\x80\x02" + body), allow)
                self.assertFalse(loaded)
                self.assertIn(expected, message)

    def test_unsupported_opcodes(self) -> None:
        rules = unpickler_rules()
        self.assertTrue({"GLOBAL", "REDUCE", "BUILD", "BINPERSID", "STOP"} <= rules.opcodes)
        for name, body in (
            ("STACK_GLOBAL", b"X\x02\x00\x00\x00osX\x06\x00\x00\x00getcwd\x93."),
            ("SHORT_BINBYTES", b"C\x01a."),
        ):
            with self.subTest(name):
                loaded, _etype, message = torch_load(torch_zip_of(b"\x80\x02" + body), [])
                code = pickle.__dict__[name][0]
                self.assertEqual(name in rules.opcodes, loaded, message)
                if not loaded:
                    self.assertIn(rules.unsupported.format(code=code), message)
        # everything torch.save writes for ordinary checkpoints, torch reads
        for obj in ({"t": torch.ones(2), "n": None, "f": 1.5, "b": True, "s": "x"}, torch.nn.Linear(1, 1).state_dict()):
            ops = records_opcodes(saved(obj))
            self.assertTrue(ops <= rules.opcodes, ops - rules.opcodes)

    def test_renames(self) -> None:
        rules = unpickler_rules()
        for proto, body in ((2, b"\x80\x02c__builtin__\ntstprobe\n."), (0, b"c__builtin__\ntstprobe\n.")):
            with self.subTest(protocol=proto):
                loaded, _etype, message = torch_load(torch_zip_of(body), [])
                self.assertFalse(loaded)
                renamed = "__builtin__" not in message
                self.assertEqual(renamed, proto == 2 or rules.renames == "always", message)
        self.assertEqual(rules.import_mapping, torch._utils.IMPORT_MAPPING)

    def test_global_refusals_are_torchs_own_messages(self) -> None:
        names = ["builtins.frozenset", f"{__name__}.Unknown", "sys.modules", "torch.distributed.tensor.DTensor"]
        for name in names:
            with self.subTest(name):
                module, _, attr = name.partition(".")
                loaded, _etype, message = torch_load(
                    torch_zip_of(b"\x80\x02c" + f"{module}\n{attr}\n".encode() + b"."), []
                )
                refusal = global_refusal(name)
                self.assertEqual(refusal is None, loaded, message)
                if refusal is not None:
                    self.assertIn(refusal, message)
        self.assertIsNone(global_refusal("collections.OrderedDict"))  # allowlisted: nothing refused

    def test_torchscript_refusal(self) -> None:
        buf = torchscript_archive()
        refusal = facts.torchscript_refusal()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that it dispatches to torch.jit.load
            try:
                value = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
            except RuntimeError as e:
                self.assertIsNotNone(refusal)
                self.assertIn(refusal, str(e))
            else:
                self.assertIsNone(refusal)
                self.assertIsInstance(value, torch.jit.ScriptModule)


def torchscript_archive() -> io.BytesIO:
    """A TorchScript archive of a tiny module (torch's deprecation warnings of torch.jit kept quiet)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(torch.nn.Linear(1, 1)), buf)
    return buf


def other_class() -> type:
    return Other


def _unlisted() -> None:
    """Never allowlisted."""


def unlisted() -> Any:
    return _unlisted


def records_opcodes(data: bytes) -> set[str]:
    import pickletools
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    return {op.name for op, _arg, _pos in pickletools.genops(pkl)}


# -- the switches: asked with a canary through torch.serialization.load ---------------------------------


class SwitchCanary:
    """Not on any allowlist: a weights-only load refuses it, a full load builds it."""


def real_load(env: dict[str, str], explicit: Optional[bool]) -> tuple[str, bool]:
    """("loaded" | "refused" | "conflict", warned) of this torch's torch.load of a SwitchCanary
    checkpoint under exactly the switches *env*, with ``weights_only=explicit`` (None: bare)."""
    data = saved(SwitchCanary())
    kwargs = {} if explicit is None else {"weights_only": explicit}
    with clean_env(**env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.load(io.BytesIO(data), **kwargs)
            outcome = "loaded"
        except pickle.UnpicklingError:
            outcome = "refused"
        except RuntimeError as e:
            if FORCE_WO not in str(e) or FORCE_NO_WO not in str(e):
                raise
            outcome = "conflict"
    return outcome, any(FORCE_NO_WO in str(w.message) for w in caught)


SPELLINGS = ("1", "y", "yes", "true", "TRUE", "Yes", "on", "t", " 1", "yes ", "0", "", "no", "false", "enable")


class TestSwitchSpellingsAreTorchs(unittest.TestCase):
    def test_each_spelling_as_torch_reads_it(self) -> None:
        for value in SPELLINGS:
            with self.subTest(value=value):
                forced, _ = real_load({FORCE_WO: value}, False)
                self.assertEqual(modes._ask(False, value, None), (forced == "refused", False))
                self.assertEqual(modes.is_truthy(value, FORCE_WO), forced == "refused")
                bare, warned = real_load({FORCE_NO_WO: value}, None)
                self.assertEqual(modes._ask(None, None, value), (bare == "refused", warned))
                self.assertEqual(modes.is_truthy(value, FORCE_NO_WO), warned)
                switches = facts.WeightsOnlySwitches.from_environ({FORCE_WO: value})
                self.assertEqual((switches.force_weights_only, switches.conflict), (forced == "refused", False))
        self.assertFalse(modes.is_truthy(None, FORCE_WO))  # unset
        self.assertFalse(modes.is_truthy(None, FORCE_NO_WO))

    def test_both_set(self) -> None:
        for wo, no in (
            ("1", "1"),
            ("TRUE", "y"),
            ("0", "Yes"),
            ("yes ", "1"),
            ("true", "false"),
            ("on", "on"),
            ("", ""),
        ):
            with self.subTest(wo=wo, no=no):
                outcome, _ = real_load({FORCE_WO: wo, FORCE_NO_WO: no}, None)
                switches = facts.WeightsOnlySwitches.from_environ({FORCE_WO: wo, FORCE_NO_WO: no})
                self.assertEqual(switches.conflict, outcome == "conflict")
                if outcome == "conflict":
                    with self.assertRaises(ConflictingEnvironmentError) as cm:
                        predict("default", Checkpoint.save(SwitchCanary()), environ={FORCE_WO: wo, FORCE_NO_WO: no})
                    self.assertEqual(str(cm.exception), switches.conflict_message())
                else:
                    exp = predict("default", Checkpoint.save(SwitchCanary()), environ={FORCE_WO: wo, FORCE_NO_WO: no})
                    self.assertEqual(exp.loads, outcome == "loaded")

    def test_spellings_described_as_torch_reads_them(self) -> None:
        for name in (FORCE_WO, FORCE_NO_WO):
            with self.subTest(name):
                explicit = False if name == FORCE_WO else None
                sets = [
                    s
                    for s in facts.CANDIDATE_SPELLINGS
                    if real_load({name: s}, explicit) == (("refused", False) if name == FORCE_WO else ("loaded", True))
                ]
                found, any_case, strips = facts.truthy_spellings(name)
                self.assertEqual(list(found), sets)
                if found:
                    upper = [real_load({name: s.upper()}, explicit)[0] for s in found]
                    self.assertEqual(any_case, upper == [real_load({name: s}, explicit)[0] for s in found])
                    self.assertEqual(
                        strips, real_load({name: f" {found[0]} "}, explicit) == real_load({name: found[0]}, explicit)
                    )
                    self.assertTrue(facts.describe_spellings(name).startswith(", ".join(found) + " ("))
        self.assertEqual(facts.torch_reads_force_no_weights_only(), real_load({FORCE_NO_WO: "1"}, None)[1])
        self.assertEqual(modes.torch_default_weights_only()[0], real_load({}, None)[0] == "refused")


# -- other releases, by stand-ins of their behaviour ----------------------------------------------------


class TestOtherReleasesReadRight(unittest.TestCase):
    """A stand-in behaving like another release: the probes report it, and the model built from
    them agrees with a real torch.load meeting the same stand-in."""

    def test_torch_2141_appends_onto_an_allowlisted_list_subclass(self) -> None:
        every_other = frozenset(APPEND_TARGETS[1:])
        own = unpickler_rules().containers["APPEND"]
        with unpickler_standin(Torch2141Append):
            rules = unpickler_rules()
            expected = ContainerRule(every_other - {"allowlisted_list_subclass"}, "Can only append to lists, but got ")
            self.assertEqual((rules.containers["APPEND"], rules.containers["APPENDS"]), (expected, expected))
            for n in (1, 2):
                for allow in ([Items], []):
                    with self.subTest(n=n, allowlisted=bool(allow)):
                        data = saved({"x": Items(range(n)), "tag": n})
                        exp = predict("safe_globals", Checkpoint.from_bytes(data), allow)
                        loaded, _etype, message = torch_load(data, allow)
                        self.assertEqual((exp.loads, loaded), (bool(allow), bool(allow)), message)
                        self.assertIsNone(Checkpoint.from_bytes(data).info.weights_only_blocker)
                        if not allow:
                            self.assertIn(f"{__name__}.Items", exp.missing)
                            self.assertIn(exp.rejection, message)
                data = saved({"x": collections.deque(range(n)), "tag": n})
                blocker = Checkpoint.from_bytes(data).info.weights_only_blocker
                self.assertEqual(blocker, "Can only append to lists, but got <class 'collections.deque'>")
                loaded, _etype, message = torch_load(data, [collections.deque])
                self.assertFalse(loaded)
                self.assertIn(blocker, message)
        # back on this torch: its own rules again
        self.assertEqual(unpickler_rules().containers["APPEND"], own)

    @unittest.skipUnless(hasattr(Torch28Setitem, "_check_set_item_target"), "this torch checks SETITEM inline")
    def test_torch_28_checks_no_setitem_target(self) -> None:
        with unpickler_standin(Torch28Setitem):
            rules = unpickler_rules()
            self.assertEqual((rules.containers["SETITEM"], rules.containers["SETITEMS"]), (None, None))
            for obj, allow in (
                (Table(a=1), [Table]),
                (Table(a=1, b=2), [Table]),
                (collections.defaultdict(int, a=1), [collections.defaultdict, int]),
            ):
                with self.subTest(type(obj).__name__, n=len(obj)):
                    data = saved({"x": obj})
                    self.assertIsNone(Checkpoint.from_bytes(data).info.weights_only_blocker)
                    self.assertTrue(predict("safe_globals", Checkpoint.from_bytes(data), allow).loads)
                    self.assertEqual(torch_load(data, allow)[0], True)
        self.assertIsNotNone(unpickler_rules().containers["SETITEM"])

    def test_torch_28_inverted_persistent_id_check(self) -> None:
        with unpickler_standin(Torch28Persid):
            persid = unpickler_rules().persid
            self.assertEqual(
                persid,
                PersidRules(
                    frozenset(["int"]), PersidRules.type_message, PersidRules.storage_message, names_type=False
                ),
            )
            for name, pid in (
                ("int", b"K\x05"),
                ("str", b"X\x03\x00\x00\x00abc"),
                ("none", b"N"),
                ("module_tuple", b"X\x06\x00\x00\x00module\x85"),
            ):
                with self.subTest(name):
                    data = torch_zip_of(b"\x80\x02" + pid + b"Q.")
                    blocker = tst.scan_checkpoint(data).weights_only_blocker
                    loaded, etype, message = torch_load(data, [])
                    self.assertFalse(loaded)
                    if etype == "UnpicklingError":  # refused by the (stand-in) unpickler itself
                        self.assertIsNotNone(blocker, message)
                        self.assertIn(blocker, message)
                    else:  # let through to torch.load's own persistent_load, which fails on a bare id
                        self.assertIsNone(blocker, message)
                    self.assertEqual(blocker is not None, name in ("int", "module_tuple"), blocker)
            self.assertEqual(
                tst.scan_checkpoint(torch_zip_of(b"\x80\x02X\x06\x00\x00\x00module\x85Q.")).weights_only_blocker,
                "Only persistent_load of storage is allowed, but got module",
            )

    def test_torch_26_spells_builtins_in_full(self) -> None:
        obj = {"frozen": frozenset([1]), "tag": 26}
        with unpickler_standin(Torch26Spelling):
            refusal = global_refusal("builtins.frozenset")
            self.assertIn("GLOBAL builtins.frozenset was not an allowed global", refusal)
            checkpoint = Checkpoint.save(obj)
            exp = predict("safe_globals", checkpoint)
            self.assertEqual(exp.rejection, refusal)
            loaded, _etype, message = torch_load(checkpoint.rewound().getvalue(), [])
            self.assertFalse(loaded)
            self.assertIn(exp.rejection, message)
            if hasattr(torch.serialization, "safe_globals"):  # the mode runs here (torch >= 2.5)
                result = tst.load(checkpoint, "safe_globals")
                self.assertFalse(result.loaded)
                self.assertIn("GLOBAL builtins.frozenset was not", str(result.error))
        # this torch again: its own spelling, whichever it is
        loaded, _etype, message = torch_load(Checkpoint.save(obj).rewound().getvalue(), [])
        self.assertIn(global_refusal("builtins.frozenset"), message)

    def test_torch_24_hands_torchscript_to_jit(self) -> None:
        # What a TorchScript archive meets is read by the tools, into its scan: a "jit" check where torch
        # hands it to torch.jit.load (2.4), which the prediction reads as a full load.
        data = torchscript_archive().getvalue()
        self.assertEqual(FileCheckpoint.from_bytes(data).format, "torchscript")
        with load_standin(switch_reader(jit_dispatch=True)), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # this torch's torch.jit.load, which the stand-in calls
            self.assertIsNone(facts.torchscript_refusal())
            checkpoint = FileCheckpoint.from_bytes(data)
            self.assertEqual([(c.kind, c.name, c.message) for c in checkpoint.info.checks], [("jit", "", "")])
            exp = predict("safe_globals", checkpoint)
            self.assertEqual((exp.weights_only, exp.loads, exp.unknown), (False, True, None))
            self.assertEqual(
                exp.reason,
                "weights_only=True explicit; this torch hands TorchScript archives to torch.jit.load whatever "
                "weights_only says",
            )
            self.assertIsInstance(torch.serialization.load(io.BytesIO(data), weights_only=True), torch.jit.ScriptModule)
        exp = predict("safe_globals", FileCheckpoint.from_bytes(data))  # this torch again
        refusal = facts.torchscript_refusal()
        if refusal is not None:
            self.assertEqual((exp.weights_only, exp.loads, exp.rejection), (True, False, refusal))
        else:
            self.assertEqual((exp.weights_only, exp.loads), (False, True))

    def test_torch_28_reads_the_switches_case_sensitively(self) -> None:
        from torch_serial_testing.tools.cli import doctor

        with load_standin(switch_reader(lower=False)):
            self.assertEqual(
                [modes.is_truthy(v, FORCE_WO) for v in ("true", "TRUE", "Y", "y")], [True, False, False, True]
            )
            self.assertIn("case-sensitive", facts.describe_spellings(FORCE_WO))
            switches = facts.WeightsOnlySwitches.from_environ({FORCE_WO: "TRUE", FORCE_NO_WO: "yes"})
            self.assertEqual(
                (switches.force_weights_only, switches.force_no_weights_only, switches.conflict), (False, True, False)
            )
            net = Checkpoint.save(SwitchCanary())
            exp = predict("weights_only_false", net, environ={FORCE_WO: "TRUE"})
            self.assertEqual((exp.weights_only, exp.loads), (False, True))
            exp = predict("weights_only_false", net, environ={FORCE_WO: "true"})
            self.assertEqual((exp.weights_only, exp.loads), (True, False))
            problems: list[str] = []
            active, text = doctor._force_effect(FORCE_WO, "TRUE", False, problems)
            self.assertFalse(active)
            self.assertIn("case-sensitive", text)
            self.assertIn("case-sensitive", problems[0])
        self.assertEqual(
            "case-sensitive" in facts.describe_spellings(FORCE_WO),
            real_load({FORCE_WO: "TRUE"}, False)[0] != "refused",
        )  # this torch again

    def test_torch_25_reads_one_switch_and_defaults_to_a_full_load(self) -> None:
        with (
            load_standin(switch_reader(reads_no=False, default=False)),
            mock.patch.object(torch, "__version__", "2.5.1"),
        ):
            self.assertFalse(modes.is_truthy("1", FORCE_NO_WO))
            self.assertTrue(modes.is_truthy("Yes", FORCE_WO))
            self.assertFalse(facts.torch_reads_force_no_weights_only())
            self.assertEqual(modes.torch_default_weights_only(), (False, "the default before torch 2.6 (torch 2.5.1)"))
            switches = facts.WeightsOnlySwitches.from_environ({FORCE_WO: "1", FORCE_NO_WO: "1"})
            self.assertEqual(
                (switches.force_weights_only, switches.force_no_weights_only, switches.conflict), (True, False, False)
            )
            exp = predict("default", Checkpoint.save(SwitchCanary()), environ={FORCE_WO: "1", FORCE_NO_WO: "y"})
            self.assertEqual((exp.weights_only, exp.warns, exp.loads), (True, False, False))
            self.assertIn(f"weights_only=True forced by {FORCE_WO}=1", exp.reason)
            exp = predict("default", Checkpoint.save(SwitchCanary()), environ={FORCE_NO_WO: "1"})
            self.assertEqual((exp.weights_only, exp.warns, exp.loads), (False, False, True))
        with load_standin(switch_reader(default=False)), mock.patch.object(torch, "__version__", "2.6.0"):
            # a torch >= 2.6 whose bare load is a full one: an fbcode build, said so
            self.assertEqual(
                modes.torch_default_weights_only(), (False, "this torch build (fbcode) keeps the old default")
            )


# -- a probe that cannot run: unknown, never a guess -------------------------------------------------------


class TestProbesThatCannotRun(unittest.TestCase):
    def test_an_unpickler_that_cannot_be_constructed(self) -> None:
        obj = {"t": torch.ones(1), "tag": "unpickler"}
        checkpoint = Checkpoint.save(obj)
        with clean_env():  # the decisions are asked of torch.load before its unpickler breaks
            for mode in ("safe_globals", "default"):
                predict(mode, checkpoint)
        with unpickler_standin(RaisingUnpickler):
            with self.assertRaises(ProbeFailed) as first:
                unpickler_rules()
            self.assertIn(
                "cannot run torch's weights-only unpickler (RuntimeError: this stand-in", str(first.exception)
            )
            with self.assertRaises(ProbeFailed) as second:
                unpickler_rules()
            self.assertIs(second.exception, first.exception)  # asked once, the same failure every time
            fresh = Checkpoint.save(obj)
            info = fresh.info
            self.assertEqual([c.kind for c in info.checks], ["unknown"])
            self.assertIn(str(first.exception), info.checks[0].message)
            self.assertIsNone(info.weights_only_blocker)
            for mode in ("safe_globals", "default"):
                with self.subTest(mode), clean_env():
                    exp = predict(mode, fresh)
                    if not exp.weights_only:  # a full load (torch < 2.6's default) needs no rules
                        self.assertIsNone(exp.unknown)
                        continue
                    self.assertEqual((exp.loads, exp.unknown), (False, str(first.exception)))
                    self.assertIn("not predicted", exp.summary())
                    with self.assertRaisesRegex(
                        UnexpectedLoadOutcome,
                        rf"^{mode}: cannot predict this load here \(cannot run torch's "
                        r"weights-only unpickler .*\); torch rejected it:\n",
                    ):
                        tst.load(fresh, mode)
            with clean_env():
                result = tst.load(fresh, "weights_only_false")  # a full load needs no unpickler rules
            self.assertTrue(result.loaded)
        exp = predict("safe_globals", Checkpoint.save(obj))
        self.assertEqual((exp.loads, exp.unknown), (True, None))

    def test_an_answer_that_cannot_be_read(self) -> None:
        class Reworded(Torch2141Append):
            """Refuses without naming the type it refuses: the rules cannot be read."""

            def load(self) -> Any:
                try:
                    return super().load()
                except pickle.UnpicklingError as e:
                    raise pickle.UnpicklingError(re.sub(r", but got .*", "", str(e))) from None

        with unpickler_standin(Reworded):
            with self.assertRaisesRegex(ProbeFailed, "does not end with the type it refused"):
                unpickler_rules()
            exp = predict("safe_globals", Checkpoint.save({"x": [1, 2], "tag": "reworded"}))
            self.assertFalse(exp.loads)
            self.assertIn("does not end with the type it refused", exp.unknown)

    def test_a_canary_load_that_raises(self) -> None:
        def broken(*args: Any, **kwargs: Any) -> Any:
            raise OSError("this stand-in torch.serialization.load cannot load anything")

        checkpoint = Checkpoint.save({"t": torch.ones(1)})
        with load_standin(broken), clean_env():
            with self.assertRaisesRegex(ProbeFailed, "canary raised OSError: this stand-in"):
                modes.decide(tst.LoadMode.DEFAULT)
            for mode in tst.LoadMode:
                with self.subTest(mode.value):
                    exp = predict(mode, checkpoint)
                    self.assertFalse(exp.loads)
                    self.assertIn("canary raised OSError", exp.unknown)
                    self.assertIn("not predicted", exp.summary())
                    if mode is tst.LoadMode.SAFE_GLOBALS and not hasattr(torch.serialization, "safe_globals"):
                        continue  # the mode skips on torch < 2.5, before anything is asked
                    # torch.load itself (not the broken torch.serialization.load) loads: said so
                    with self.assertRaisesRegex(
                        UnexpectedLoadOutcome,
                        rf"^{mode.value}: cannot predict this load "
                        r"here \(torch.load of the library's canary raised OSError.*\); "
                        r"torch loaded it$",
                    ):
                        tst.load(checkpoint, mode)
        self.assertIsNone(predict("default", checkpoint).unknown)

    def test_a_torchscript_probe_that_fails(self) -> None:
        data = torchscript_archive().getvalue()
        real = torch.serialization.load

        def no_torchscript(f: Any, *args: Any, **kwargs: Any) -> Any:
            start = f.tell()
            head = f.read(4)
            f.seek(start)
            if head == b"PK\x03\x04" and unpickler.is_torchscript(torch._C.PyTorchFileReader(f)):
                f.seek(start)
                raise ValueError("this stand-in cannot read TorchScript archives")
            f.seek(start)
            return real(f, *args, **kwargs)

        with load_standin(no_torchscript):
            with self.assertRaisesRegex(ProbeFailed, "TorchScript archive .* raised in .*ValueError"):
                facts.torchscript_refusal()
            info = tools.scan_checkpoint(data)
            self.assertEqual(info.format, "torchscript")
            self.assertEqual([c.kind for c in info.checks], ["unknown"])
            self.assertIn("what this torch does with a TorchScript archive is unknown: ", info.checks[0].message)
            exp = predict("safe_globals", FileCheckpoint.from_bytes(data))
            self.assertFalse(exp.loads)
            self.assertIn("this stand-in cannot read TorchScript archives", exp.unknown)
            self.assertTrue(predict("safe_globals", Checkpoint.save({"t": torch.ones(1)})).loads)  # others: known


class TestTheCoreReadsNoTorchScript(unittest.TestCase):
    """The core reads the zip archive torch.save writes; a TorchScript archive raises, naming the tools,
    whether or not the tools read the same bytes before (the scans of small checkpoints are remembered
    by content, and by the reader that made them)."""

    MESSAGE = (
        "this is a TorchScript archive (torch.jit.save wrote it): torch.load hands it to torch.jit.load; "
        "read it with torch_serial_testing.tools.scan_checkpoint"
    )

    def check_refused(self, data: bytes) -> None:
        for read in (
            lambda: Checkpoint.from_bytes(data).info,
            lambda: Checkpoint.from_bytes(data).format,
            lambda: tst.scan_checkpoint(data),
            lambda: predict("safe_globals", Checkpoint.from_bytes(data)),
        ):
            with self.assertRaises(CheckpointFormatError) as cm:
                read()
            self.assertEqual(str(cm.exception), self.MESSAGE)

    def test_before_and_after_the_tools_read_it(self) -> None:
        data = torchscript_archive().getvalue()
        with mock.patch.dict(checkpoint_module._small_infos, clear=True):
            self.check_refused(data)
            self.assertEqual(tools.scan_checkpoint(data).format, "torchscript")
            self.assertEqual(FileCheckpoint.from_bytes(data).format, "torchscript")
            self.check_refused(data)


class TestNothingReadsSource(unittest.TestCase):
    """Every probe runs afresh with the ways of reading source text made to fail."""

    def test_probes_read_no_source(self) -> None:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"source text read: {args[:1]!r}")

        readers = [(inspect, n) for n in ("getsource", "getsourcelines", "getsourcefile", "findsource", "getfile")]
        readers += [(linecache, n) for n in ("getline", "getlines", "updatecache")]
        readers += [(ast, "parse"), (tokenize, "open")]
        forget_probes()
        modes._answers.clear()
        with mock.patch("builtins.compile", side_effect=refuse), mock.patch("builtins.eval", side_effect=refuse):
            patches = [mock.patch.object(module, name, side_effect=refuse) for module, name in readers]
            for p in patches:
                p.start()
            try:
                unpickler_rules()
                global_refusal("builtins.frozenset")
                facts.torchscript_refusal()
                facts.truthy_spellings(FORCE_WO)
                facts.truthy_spellings(FORCE_NO_WO)
                modes.torch_default_weights_only()
                exp = predict("safe_globals", Checkpoint.save({"f": frozenset([1]), "tag": "no source"}))
            finally:
                for p in patches:
                    p.stop()
        self.assertFalse(exp.loads)
        self.assertIsNone(exp.unknown)


if __name__ == "__main__":
    unittest.main()
