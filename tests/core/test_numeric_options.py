"""Every numeric option of every command is checked where it is parsed (#28: `sglang validate --gpu-mem-gib nan` ended in
`ValueError: cannot convert float NaN to integer`, exit 1): nan, inf, -inf and 1e400 for a float, a huge value for an
integer, each through the real CLI -> one line naming the option, exit 3, no traceback. The options are found by walking
the click tree, so an option added later is covered without a line here."""

import click
import pytest

from gpudoctor import cli as cli_mod
from gpudoctor.options import Count, Finite, NumberList
from tests.console import commands

NON_FINITE = ["nan", "inf", "-inf", "1e400", "-1e400", "NaN"]
HUGE_INT = str(10**30)




def _numeric_params():
    out = []
    for path, cmd in [((), cli_mod.cli), *commands(cli_mod.cli)]:
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.count or p.is_flag):
                continue
            if isinstance(p.type, (click.types.FloatParamType, click.types.IntParamType, NumberList)):
                out.append((path, p))
    return out


PARAMS = _numeric_params()
IDS = [f"{' '.join(path) or 'gpudoctor'} {p.opts[0]}" for path, p in PARAMS]


def _bad_values(p):
    if isinstance(p.type, click.types.FloatParamType):
        vals = list(NON_FINITE)
    elif isinstance(p.type, NumberList):
        vals = NON_FINITE + [HUGE_INT, "1," + "nan", "2,1e400"]
    else:
        vals = ["nan", "inf", "1e400", HUGE_INT, "-" + HUGE_INT]
    lo = getattr(p.type, "min", None)
    if lo is not None:  # and one just outside the range
        vals.append(str(lo if getattr(p.type, "min_open", False) else lo - 1))
    return vals


def _run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_mod._run(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_the_walk_finds_the_numeric_options():
    found = set(IDS)
    for want in ("check --timeout", "sglang validate --gpu-mem-gib", "sglang validate --input-len",
                 "bench load --request-rate", "bench load --concurrency", "daemon --interval", "lxc audit vmid"):
        assert want in found, want


@pytest.mark.parametrize("path,param", PARAMS, ids=IDS)
def test_every_numeric_option_has_a_checked_type(path, param):
    """A float is Finite (click's FLOAT and FloatRange let nan/inf through); an integer has an upper bound."""
    t = param.type
    if isinstance(t, click.types.FloatParamType):
        assert isinstance(t, Finite)
    elif isinstance(t, click.types.IntParamType):
        assert isinstance(t, Count) and t.max is not None
    elif isinstance(t, NumberList):  # each item parsed by its kind, checked finite in convert(), bounded above
        assert t.kind in (int, float) and t.max is not None and t.max < float("inf"), (t.kind, t.max)
    else:
        raise AssertionError(f"{t!r}: a numeric option of no checked type")


@pytest.mark.parametrize("path,param", PARAMS, ids=IDS)
def test_every_numeric_option_refuses_non_finite_and_huge_values(path, param, capsys):
    name = param.opts[0]
    for value in _bad_values(param):
        argv = [*path, name, value] if isinstance(param, click.Option) else [*path, value]
        if value.startswith("-"):  # a negative number, not an option
            argv = [*path, f"{name}={value}"] if isinstance(param, click.Option) else [*path, "--", value]
        code, out, err = _run(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 3, (argv, out, err)
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)
        label = name if isinstance(param, click.Option) else param.human_readable_name
        assert label in lines[0], (argv, lines[0])


def test_in_range_values_still_parse():
    assert Finite(0, 1).convert("0.5", None, None) == 0.5
    assert Count(0, human=True).convert("32k", None, None) == 32000
    assert Count(0, human=True).convert("32Ki", None, None) == 32768
    assert NumberList(int, 1, 10).convert("1,4, 8", None, None) == [1, 4, 8]
    assert NumberList(float, 0, 100, min_open=True).convert("0.5,2", None, None) == [0.5, 2.0]
