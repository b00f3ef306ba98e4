"""Parse sglang.launch_server arguments the way SGLang's argparse does, but report every problem, not the first.

SGLang builds a plain `argparse.ArgumentParser(prog="sglang serve")` (allow_abbrev=True) in
python/sglang/srt/server_args.py::prepare_server_args. So `--tp 8` means `--tp-size 8`, a prefix that matches
two flags is an error ("ambiguous option"), and an unknown flag ends the launch with "unrecognized arguments".
This module reproduces CPython's argparse rules (_parse_optional, _get_option_tuples, nargs patterns) over a
flag table generated from the real parser (flagtable_*.py), with no import of SGLang.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NEG_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_ZERO_ARG_KINDS = {"store_true", "store_false", "store_const", "bool_optional", "deprecated", "help"}


@dataclass
class Flag:
    """One argparse action of SGLang's parser."""

    opts: list[str]
    dest: str
    kind: str
    nargs: object
    type: str | None
    choices: list[str] | None
    default: object
    required: bool

    @property
    def zero_arg(self) -> bool:
        return self.nargs == 0 or (self.kind in _ZERO_ARG_KINDS and self.kind != "deprecated")

    @property
    def primary(self) -> str:
        longs = [o for o in self.opts if o.startswith("--")]
        return longs[0] if longs else self.opts[0]


@dataclass
class ParseProblem:
    """An argparse error SGLang would stop on (exit 2), or a note (abbreviation, duplicate, deprecated)."""

    kind: str  # unknown | ambiguous | missing_value | bad_value | required | explicit_arg | abbreviated | duplicate | deprecated | positional
    token: str
    message: str
    candidates: list[str] = field(default_factory=list)
    flag: str | None = None  # the full flag the token resolved to


@dataclass
class ParsedArgs:
    """What argparse would hand to ServerArgs: explicit values by dest, plus the problems met on the way."""

    values: dict  # dest -> value for flags given on the command line (after type conversion)
    given: dict  # dest -> the full flag spelling that set it
    problems: list[ParseProblem]
    defaults: dict  # dest -> parser default

    @property
    def errors(self) -> list[ParseProblem]:
        return [p for p in self.problems if p.kind not in ("abbreviated", "duplicate", "deprecated")]

    def get(self, dest: str, default=None):
        if dest in self.values:
            return self.values[dest]
        return self.defaults.get(dest, default)

    def is_set(self, dest: str) -> bool:
        return dest in self.values


class FlagTable:
    """SGLang's option strings and how many values each takes."""

    def __init__(self, rows: list[dict], version: str):
        self.version = version
        self.flags = [Flag(**{k: r.get(k) for k in Flag.__dataclass_fields__}) for r in rows]
        self.by_opt: dict[str, Flag] = {}
        for f in self.flags:
            for o in f.opts:
                self.by_opt[o] = f
        self.by_dest: dict[str, Flag] = {}
        for f in self.flags:
            self.by_dest.setdefault(f.dest, f)
        self._has_negative_number_optionals = any(_NEG_NUMBER.match(o) for o in self.by_opt)

    def option_for(self, dest: str) -> str:
        f = self.by_dest.get(dest)
        return f.primary if f else "--" + dest.replace("_", "-")

    # CPython argparse._parse_optional: None = positional; (flag|None, option_string, explicit_arg)
    def classify(self, arg: str, problems: list[ParseProblem] | None = None):
        if not arg or arg[0] != "-":
            return None
        if arg in self.by_opt:
            return self.by_opt[arg], arg, None
        if len(arg) == 1:
            return None
        if "=" in arg:
            opt, explicit = arg.split("=", 1)
            if opt in self.by_opt:
                return self.by_opt[opt], opt, explicit
        matches = self._option_tuples(arg)
        if len(matches) > 1:
            if problems is not None:
                names = [m[1] for m in matches]
                problems.append(ParseProblem(
                    "ambiguous", arg, f"ambiguous option: {arg} could match {', '.join(names)}", candidates=names))
            return "AMBIGUOUS", arg, None
        if len(matches) == 1:
            flag, opt, explicit = matches[0]
            if problems is not None:
                problems.append(ParseProblem("abbreviated", arg, f"{arg.split('=', 1)[0]} is read as {opt}", flag=opt))
            return flag, opt, explicit
        if _NEG_NUMBER.match(arg) and not self._has_negative_number_optionals:
            return None
        if " " in arg:
            return None
        return "UNKNOWN", arg, None

    def _option_tuples(self, arg: str):
        out = []
        if len(arg) > 1 and arg[1] == "-":
            prefix, explicit = (arg.split("=", 1) + [None])[:2] if "=" in arg else (arg, None)
            for opt, flag in self.by_opt.items():
                if opt.startswith(prefix):
                    out.append((flag, opt, explicit))
        else:
            short_prefix, short_explicit = arg[:2], arg[2:]
            for opt, flag in self.by_opt.items():
                if opt == short_prefix:
                    out.append((flag, opt, short_explicit))
                elif opt.startswith(arg):
                    out.append((flag, opt, None))
        return out

    def suggest(self, token: str) -> list[str]:
        import difflib

        name = token.split("=", 1)[0]
        longs = [o for o in self.by_opt if o.startswith("--")]
        return difflib.get_close_matches(name, longs, n=3, cutoff=0.75)

    def parse(self, argv: list[str]) -> ParsedArgs:
        """Walk argv like argparse.parse_args; collect every error instead of exiting on the first."""
        problems: list[ParseProblem] = []
        classified = []
        after_dashdash = False
        for tok in argv:
            if after_dashdash:
                classified.append(None)
            elif tok == "--":
                after_dashdash = True
                classified.append("--")
            else:
                classified.append(self.classify(tok, problems))
        values: dict = {}
        given: dict = {}
        extras: list[str] = []
        i = 0
        while i < len(argv):
            c, tok = classified[i], argv[i]
            i += 1
            if c == "--":
                continue
            if c is None:
                extras.append(tok)
                continue
            flag, opt, explicit = c
            if flag == "AMBIGUOUS":
                # Every candidate takes a value (e.g. --cuda-graph-max-bs-{decode,prefill}): skip that value too.
                cands = [self.by_opt[m[1]] for m in self._option_tuples(tok)]
                if cands and all(not c.zero_arg for c in cands) and "=" not in tok \
                        and i < len(argv) and classified[i] is None:
                    i += 1
                continue
            if flag == "UNKNOWN":
                extras.append(tok)
                continue
            # Gather the values this action consumes.
            vals: list[str] = []
            if flag.zero_arg:
                if explicit is not None:
                    problems.append(ParseProblem(
                        "explicit_arg", tok, f"argument {opt}: ignored explicit argument '{explicit}'", flag=opt))
                    continue
            else:
                if explicit is not None:
                    vals = [explicit]
                else:
                    nargs = flag.nargs
                    avail = []
                    j = i
                    while j < len(argv) and classified[j] is None:
                        avail.append(argv[j])
                        j += 1
                    if nargs is None or nargs == 1:
                        need, maxn = 1, 1
                    elif nargs == "?":
                        need, maxn = 0, 1
                    elif nargs == "*":
                        need, maxn = 0, len(avail)
                    elif nargs == "+":
                        need, maxn = 1, len(avail)
                    elif isinstance(nargs, int):
                        need, maxn = nargs, nargs
                    else:
                        need, maxn = 1, 1
                    if len(avail) < need:
                        msg = "expected one argument" if need == 1 and nargs in (None, 1) else (
                            "expected at least one argument" if nargs == "+" else f"expected {need} arguments")
                        problems.append(ParseProblem("missing_value", tok, f"argument {opt}: {msg}", flag=flag.primary))
                        continue
                    vals = avail[:maxn]
                    i += len(vals)
            converted = self._convert(flag, opt, vals, problems)
            if converted is _BAD:
                continue
            if flag.dest in given and flag.kind not in ("append",):
                problems.append(ParseProblem(
                    "duplicate", tok, f"{flag.primary} is given more than once; argparse keeps the last value", flag=flag.primary))
            if flag.kind == "deprecated":
                problems.append(ParseProblem("deprecated", tok, f"{opt} is deprecated in SGLang {self.version}", flag=opt))
            values[flag.dest] = converted
            given[flag.dest] = flag.primary
        for f in self.flags:
            if f.required and f.dest not in values:
                problems.append(ParseProblem(
                    "required", f.primary, f"the following arguments are required: {f.primary}", flag=f.primary))
        if extras:
            problems.append(ParseProblem(
                "unknown", " ".join(extras), f"unrecognized arguments: {' '.join(extras)}",
                candidates=[s for t in extras if t.startswith("-") for s in self.suggest(t)]))
        defaults = {f.dest: f.default for f in self.flags}
        return ParsedArgs(values=values, given=given, problems=problems, defaults=defaults)

    def _convert(self, flag: Flag, opt: str, vals: list[str], problems: list[ParseProblem]):
        kind = flag.kind
        if kind == "store_true" or (kind == "deprecated" and flag.zero_arg):
            return True
        if kind == "store_false":
            return False
        if kind == "store_const":
            return flag.default if flag.default is not None else True
        if kind == "bool_optional":
            return not opt.startswith("--no-")
        out = []
        for v in vals:
            cv = v
            if flag.type == "human_int":
                cv = human_readable_int(v)
                if cv is None:
                    problems.append(ParseProblem(
                        "bad_value", f"{opt} {v}", f"argument {opt}: Invalid integer value: '{v}'", flag=flag.primary))
                    return _BAD
            elif flag.type in ("int", "float"):
                try:
                    cv = int(v) if flag.type == "int" else float(v)
                except ValueError:
                    problems.append(ParseProblem(
                        "bad_value", f"{opt} {v}", f"argument {opt}: invalid {flag.type} value: '{v}'", flag=flag.primary))
                    return _BAD
            if flag.choices is not None and str(cv) not in flag.choices:
                shown = ", ".join(repr(c) for c in flag.choices)
                problems.append(ParseProblem(
                    "bad_value", f"{opt} {v}",
                    f"argument {opt}: invalid choice: '{v}' (choose from {shown})", flag=flag.primary))
                return _BAD
            out.append(cv)
        if flag.nargs in (None, "?"):
            return out[0] if out else flag.default
        return out


_BAD = object()
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def human_readable_int(value: str) -> int | None:
    """SGLang's utils/common.py::human_readable_int: 32768, 32k, 25.6k, 32Ki; None when invalid."""
    from decimal import Decimal

    value = value.strip()
    m = _HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
        if suffix in iec:
            return None if "." in number else int(number) * iec[suffix]
        return int(Decimal(number) * {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[suffix])
    try:
        return int(value)
    except ValueError:
        return None


def load_table(version: str = "0.5.23") -> FlagTable:
    """The flag table for an SGLang version (only the versions shipped in gpudoctor/sglang/flagtable_*.py)."""
    import importlib

    mod_name = "gpudoctor.sglang.flagtable_" + version.replace(".", "_")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise KeyError(version) from exc
    return FlagTable(mod.FLAGS, mod.VERSION)


def available_versions() -> list[str]:
    import os
    import pkgutil

    out = []
    for m in pkgutil.iter_modules([os.path.dirname(__file__)]):  # this package's files, without importing it
        if m.name.startswith("flagtable_"):
            out.append(m.name[len("flagtable_"):].replace("_", "."))
    return sorted(out)
