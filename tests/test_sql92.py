"""The SQL92 filter language (raftmq.broker.sql92) against RocketMQ's rules
(`SelectorParser.jj`, `filter/expression/*`; the reference's §3.3-3.4): a table of
expressions with what each gives over one set of properties, a table of expressions
that must not compile with the problem and position each error names, and properties
checked against Python's own arithmetic and Kleene's three-valued logic."""

from __future__ import annotations

import contextlib
import math
import operator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from raftmq.broker.sql92 import (
    RESULT_KEY_MAX_BYTES,
    RESULTS_CACHED,
    Sql92Error,
    Sql92EvaluationError,
    compile_sql92,
)

from raftmq.protocol.message import MessageExt, encode, read_dispatch_fields, string_to_properties

ERROR = "error"  # the value does not convert: Sql92EvaluationError, no match

PROPS = {
    "a": "10",
    "b": "abc",
    "f": "2.5",
    "neg": "-3",
    "big": "10000000000",
    "t": "true",
    "T": "TRUE",
    "q": "it's",
    "s": " 10",
    "n": "NaN",
    "TAGS": "TagA",
    "nota": "x",
    "$x_1": "1",
}

CASES = [
    # the reference's test vectors (a="10", b="abc")
    ("a > 5 AND b = 'abc'", True),
    ("a BETWEEN 0 AND 3", False),
    ("c IS NULL", True),
    ("c = 'x'", None),
    ("NOT (c = 'x')", None),
    ("b > 1", ERROR),
    ("a IN ('10','11')", True),
    # precedence: OR below AND below comparisons; NOT binds to the operand next to it
    ("a = 10 OR b = 'x' AND c = 'y'", True),
    ("(a = 10 OR b = 'x') AND c = 'y'", None),
    ("NOT a = 10", False),  # (NOT a) = 10: TRUE compared with 10
    ("NOT (a = 10)", False),
    ("NOT (a = 11)", True),
    ("a > 5 = TRUE", True),  # (a > 5) = TRUE
    ("a = 10 AND b = 'abc' OR c = 'z'", True),
    ("c = 'z' OR a = 10 AND b = 'abc'", True),
    # three-valued AND / OR / NOT
    ("c = 'x' OR a = 10", True),
    ("c = 'x' OR a = 11", None),
    ("c = 'x' AND a = 11", False),
    ("c = 'x' AND a = 10", None),
    ("NOT c", None),
    ("NOT a", True),  # a present: a boolean cast gives FALSE
    ("a", False),
    ("c", None),
    ("TRUE", True),
    ("FALSE", False),
    ("NULL", None),
    ("NOT NULL", None),
    # evaluation stops at a dominant value, so a bad right-hand side does not matter
    ("a = 10 OR b > 1", True),
    ("a = 11 AND b > 1", False),
    ("b > 1 OR a = 10", ERROR),
    # numbers: a property string is parsed as the other side's type
    ("a = 10", True),
    ("a = 10L", True),
    ("a = 10.0", True),
    ("a = 1e1", True),
    ("a = 10.", True),
    ("a = .1e2", True),
    ("a = 0.0", False),
    ("a > 9.5", True),
    ("a >= 10 AND a <= 10", True),
    ("a < 10", False),
    ("a > -5", True),
    ("neg < 0", True),
    ("neg = -3", True),
    ("f > 2", ERROR),  # Integer.valueOf("2.5")
    ("f > 2.0", True),
    ("big > 5", ERROR),  # beyond an int
    ("big > 5L", ERROR),  # an L literal that fits in an int is one, as in Java
    ("big > 2147483648", True),  # a long literal
    ("big > -2147483648", True),  # so is this: minus on a long
    ("s = 10", ERROR),  # Integer.valueOf does not trim
    ("s = 10.0", True),  # Double.valueOf does
    ("n > 1.0", True),  # Java orders NaN above everything
    # two properties under < <= > >=: both read as doubles
    ("f < a", True),
    ("a < f", False),
    ("a > b", ERROR),
    # strings
    ("b = 'abc'", True),
    ("b <> 'abc'", False),
    ("b <> 'abd'", True),
    ("c <> 'abc'", None),
    ("a = '10'", True),
    ("q = 'it''s'", True),
    ("b IN ('abc', 'x')", True),
    ("b NOT IN ('abc')", False),
    ("b NOT IN ('x', 'y')", True),
    ("c IN ('x')", None),
    ("c NOT IN ('x')", None),
    ("a IN ('10.0')", False),
    ("TAGS = 'TagA'", True),
    ("TAGS IN ('TagA', 'TagB')", True),
    # booleans: Boolean.valueOf, case-insensitive "true"
    ("t = TRUE", True),
    ("T = TRUE", True),
    ("TRUE = t", True),  # Java: ClassCastException, no match (docs/clients.md)
    ("b = TRUE", False),
    ("b = FALSE", True),
    # BETWEEN is >= AND <=, NOT BETWEEN is < OR >
    ("a BETWEEN 10 AND 10", True),
    ("a BETWEEN 9.5 AND 10.5", True),
    ("a BETWEEN 1 AND 9", False),
    ("a NOT BETWEEN 0 AND 9", True),
    ("a NOT BETWEEN 0 AND 10", False),
    ("c BETWEEN 1 AND 2", None),
    ("c NOT BETWEEN 1 AND 2", None),
    ("f BETWEEN 1 AND 3", ERROR),
    # IS [NOT] NULL
    ("a IS NULL", False),
    ("a IS NOT NULL", True),
    ("c IS NOT NULL", False),
    ("5 IS NULL", False),
    # the lexer: keywords in any case, names that start with one, comments, blanks
    ("a between 1 and 20 and b in ('abc')", True),
    ("a Is Not Null", True),
    ("nota = 'x' AND $x_1 = 1", True),
    ("a = 10 -- a comment to the end", True),
    ("/* before */ a = 10 /* after */", True),
    ("\ta\r\n=\f10 ", True),
    ("A = 10", None),  # names are case-sensitive
]


@pytest.mark.parametrize(("expression", "expected"), CASES)
def test_expression_over_the_properties(expression, expected):
    compiled = compile_sql92(expression)
    if expected == ERROR:
        with pytest.raises(Sql92EvaluationError):
            compiled.evaluate(PROPS)
    else:
        assert compiled.evaluate(PROPS) is expected
    assert compiled.matches(PROPS) is (expected is True)


BAD = [
    ("", "the expression is empty"),
    ("   ", "the expression is empty"),
    ("a >", "column 4: the expression ends too early"),
    ("a = 1\nAND b >", "line 2, column 8: the expression ends too early"),
    ("(a = 1", "column 7: the expression ends too early; expected"),
    ("a = 'x", "column 5: a 'string' without its closing quote"),
    ("a == 1", "column 4: unexpected '='"),
    ("a != 1", "column 3: unexpected character '!'"),
    ('"a" = 1', "column 1: unexpected character '\"'"),
    ("a LIKE 'x%'", "column 3: unexpected 'LIKE'"),
    ("a + 1 > 2", "column 3: unexpected '+'"),
    ("05 = a", "column 2: unexpected '5'"),
    ("a > 5 b", "column 7: unexpected 'b'"),
    ("a.b = 1", "column 2: unexpected character '.'"),
    ("a = NULL", "column 5: NULL cannot be compared with = or <>: use IS NULL"),
    ("NULL <> a", "column 1: NULL cannot be compared"),
    ("a > 'x'", "column 5: 'x' cannot be compared with >: only numbers can"),
    ("'x' <= a", "column 1: 'x' cannot be compared with <="),
    ("a > TRUE", "column 5: TRUE cannot be compared with >"),
    ("a > b > c", "column 1: (a > b) cannot be compared with >"),
    ("a BETWEEN 'a' AND 'b'", "'a' cannot be compared with >="),
    ("TRUE = 1", "column 1: TRUE cannot be compared with 1"),
    ("a IN (1)", "column 7: unexpected '1'; expected a 'string'"),
    ("a IN ()", "column 7: unexpected ')'"),
    ("1 IN ('1')", "column 1: IN needs a property on its left, not 1"),
    ("a BETWEEN 3 AND 1", "column 11: BETWEEN 3 AND 1: the low bound is the higher"),
    ("a BETWEEN NULL AND 1", "the bounds of BETWEEN cannot be NULL"),
    ("99999999999999999999 = a", "column 1: 99999999999999999999 does not fit in a long"),
    ("9223372036854775808L = a", "does not fit in a long"),
    ("1e400 > a", "column 1: 1e400 is beyond the range of a double"),
    ("a AND 5", "column 7: 5 is not a condition"),
    ("5", "column 1: 5 is not a condition"),
    ("'abc'", "column 1: 'abc' is not a condition"),
    ("NOT 5", "column 5: 5 is not a condition"),
    ("-a", "column 1: -a is not a condition"),
]


@pytest.mark.parametrize(("expression", "problem"), BAD)
def test_a_bad_expression_names_the_problem_and_where(expression, problem):
    with pytest.raises(Sql92Error) as caught:
        compile_sql92(expression)
    assert problem in str(caught.value)


def test_limits_keep_hostile_input_to_an_error():
    """Deep nesting, huge numbers and huge literals end in a short Sql92Error or no
    match, never in a RecursionError or Python's digit limit for int()."""
    for expression in (" AND ".join(["a = 1"] * 401), "NOT " * 3000 + "a"):
        with pytest.raises(Sql92Error, match="nests more than 400 operators"):
            compile_sql92(expression)
    assert compile_sql92(" AND ".join(["a = 1"] * 300)).matches({"a": "1"})
    with pytest.raises(Sql92Error, match="does not fit in a long") as caught:
        compile_sql92("a = " + "9" * 5000)
    assert len(str(caught.value)) < 100
    with pytest.raises(Sql92Error, match=r"^column 1: 'x+\.\.\. cannot be compared with >"):
        compile_sql92("'" + "x" * 5000 + "' > a")
    with pytest.raises(Sql92Error, match=r"^column 3: unexpected 'y+\.\.\.'"):
        compile_sql92("a " + "y" * 5000)
    assert compile_sql92("x" * 5000 + " IS NULL").matches({"x" * 5000: "1"}) is False
    huge = {"a": "9" * 5000}
    for expression in ("a = 1", "a = 10000000000", "a < 1.5", "a = TRUE"):
        assert compile_sql92(expression).matches(huge) is False


def test_compiled_once_per_text_and_errors_cached_too():
    assert compile_sql92("a > 5 AND b = 'x'") is compile_sql92("a > 5 AND b = 'x'")
    with pytest.raises(Sql92Error) as first:
        compile_sql92("a >")
    with pytest.raises(Sql92Error) as second:
        compile_sql92("a >")
    assert first.value is second.value


def test_a_stored_record_is_matched_over_its_properties():
    record = encode(MessageExt("T", b"x", {"TAGS": "TagA", "a": "7"}))
    properties = read_dispatch_fields(record)[6]
    assert compile_sql92("a = 7 AND TAGS = 'TagA'").matches_properties(properties)
    assert not compile_sql92("a = 8").matches_properties(properties)
    assert not compile_sql92("b = 1").matches_properties(properties)
    assert compile_sql92("a = 7").matches_properties(b"a\x017\x02b\x01\xff\x02")


# Raw properties as a stored record holds them, and odder: names that are prefixes or
# suffixes of one another, duplicates, empty names and values, \x01 in a value, bytes
# that are not UTF-8 next to the separators, items without a \x01.
RAW_ITEMS = st.tuples(
    st.sampled_from([b"a", b"ab", b"b", b"xa", b"TAGS", b"", b"a\xc3"]),
    st.sampled_from([b"\x01", b"", b"\x01\x01"]),
    st.sampled_from([b"7", b"12", b"1", b"x", b"", b"\xc3\xa9", b"\xc3", b"\x017", b"9\xff"]),
).map(b"".join)
RAW = st.lists(RAW_ITEMS, max_size=6).map(b"\x02".join) | st.binary(max_size=12)
READING = [
    "a > 5", "a = 7 AND TAGS = 'x'", "ab IN ('x', '7') OR b IS NULL", "NOT (xa <= 12)",
    "a BETWEEN -1 AND 12 AND ab IS NOT NULL", "TRUE", "b = '\u00e9'", "TAGS",
]  # fmt: skip


@example(b"xa\x017")  # another name ending in one read
@example(b"a\x01\x02a\x017\x02a\x01")  # empty values are skipped, a later one wins
@example(b"a\x011\x02b\x01x")  # and then keys that share a start:
@example(b"a\x0112\x02b\x01x")
@given(RAW)
def test_raw_properties_match_as_their_parsed_dict(raw):
    """`matches_properties` reads only the items the expression names (and caches its
    answer by them): the same answer as the whole properties, parsed, every time."""
    for expression in READING:
        compiled = compile_sql92(expression)
        expected = compiled.matches(string_to_properties(raw.decode("utf-8", "replace")))
        assert compiled.matches_properties(raw) is expected, expression
        assert compiled.matches_properties(raw) is expected  # from the cache, when it fits


def test_cached_results_are_bounded():
    present = compile_sql92("k IS NOT NULL")
    present._results.clear()  # filters are shared by their text, with what they cached
    assert present.matches_properties(b"k\x01" + b"9" * RESULT_KEY_MAX_BYTES) is True
    assert present._results == {}  # too long to keep
    compiled = compile_sql92("k > 5")
    compiled._results.clear()
    for k in range(RESULTS_CACHED + 3):
        assert compiled.matches_properties(b"k\x01%d\x02UNIQ_KEY\x01u%d" % (k, k)) is (k > 5)
    assert compiled._results == {
        b"k\x01%d" % k: k > 5 for k in range(RESULTS_CACHED, RESULTS_CACHED + 3)
    }


# ---------------------------------------------------------------- properties

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63) + 1, 2**63 - 1)
OPERATORS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
OPERATORS |= {"=": operator.eq, "<>": operator.ne}


def literal(value: int, long: bool = False) -> str:
    """`value` as SQL92 text: a negative number is unary minus on a positive one."""
    return f"{value}{'L' if long else ''}" if value >= 0 else f"-{-value}{'L' if long else ''}"


@given(INT32, INT32, st.sampled_from(sorted(OPERATORS)))
def test_int_comparisons_agree_with_python(x, y, op):
    assert compile_sql92(f"a {op} {literal(y)}").evaluate({"a": str(x)}) is OPERATORS[op](x, y)


# A literal is a long only when it does not fit in an int (an L suffix does not matter).
LONG_LITERALS = st.integers(2**31, 2**63 - 1) | st.integers(-(2**63) + 1, -(2**31))


@given(INT64, LONG_LITERALS, st.sampled_from(sorted(OPERATORS)), st.booleans())
def test_long_comparisons_agree_with_python(x, y, op, suffix):
    compiled = compile_sql92(f"a {op} {literal(y, long=suffix)}")
    assert compiled.evaluate({"a": str(x)}) is OPERATORS[op](x, y)


@given(
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=0.0, allow_infinity=False).filter(lambda y: math.copysign(1, y) > 0),
)
def test_double_comparisons_agree_with_python(x, y):
    # repr(y) always has a "." or an exponent: a double literal
    assert compile_sql92(f"a > {y!r}").evaluate({"a": repr(x)}) is (x > y)


@given(INT32, INT32, INT32)
def test_between_is_an_inclusive_range_and_not_between_its_complement(x, low, high):
    props = {"a": str(x)}
    inside = f"a BETWEEN {literal(low)} AND {literal(high)}"
    outside = f"a NOT BETWEEN {literal(low)} AND {literal(high)}"
    try:
        compiled = compile_sql92(inside)
    except Sql92Error:  # constant bounds in the wrong order are refused
        assert low > high and low >= 0 and high >= 0
        return
    assert compiled.evaluate(props) is (low <= x <= high)
    assert compile_sql92(outside).evaluate(props) is not (low <= x <= high)


@given(st.text(), st.text())
def test_a_quoted_string_is_read_back_exactly(value, other):
    quoted = "'" + value.replace("'", "''") + "'"
    assert compile_sql92(f"a = {quoted}").evaluate({"a": value}) is True
    assert compile_sql92(f"a IN ({quoted})").evaluate({"a": other}) is (other == value)


# Kleene's three-valued logic, against expressions built from atoms that are TRUE,
# FALSE or NULL, written with no more parentheses than precedence needs.
ATOMS = {"(x = 1)": True, "(x = 2)": False, "(z = 1)": None}


def kleene(tree):
    kind = tree[0]
    if kind == "atom":
        return ATOMS[tree[1]]
    if kind == "not":
        value = kleene(tree[1])
        return None if value is None else not value
    left, right = kleene(tree[1]), kleene(tree[2])
    dominant = kind == "or"
    if dominant in (left, right):
        return dominant
    return None if None in (left, right) else not dominant


LEVEL = {"or": 0, "and": 1, "not": 2, "atom": 3}


def render(tree, parent_level: int = 0) -> str:
    kind = tree[0]
    if kind == "atom":
        return tree[1]
    if kind == "not":
        text = f"NOT {render(tree[1], LEVEL['not'])}"
    else:
        # left-associative: the right operand needs parentheses at its own level too
        left = render(tree[1], LEVEL[kind])
        right = render(tree[2], LEVEL[kind] + 1)
        text = f"{left} {kind.upper()} {right}"
    return f"({text})" if LEVEL[kind] < parent_level else text


trees = st.recursive(
    st.tuples(st.just("atom"), st.sampled_from(sorted(ATOMS))),
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
    ),
    max_leaves=12,
)


@given(trees)
def test_and_or_not_follow_three_valued_logic_and_precedence(tree):
    text = render(tree)
    assert compile_sql92(text).evaluate({"x": "1"}) is kleene(tree), text


PIECES = [*"ab5'()<>=!.-_\n", " ", "AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "1.5"]


@given(st.lists(st.sampled_from(PIECES), max_size=20).map("".join) | st.text())
def test_any_text_compiles_or_raises_sql92_error(text):
    try:
        compiled = compile_sql92(text)
    except Sql92Error as exc:
        assert str(exc)
        return
    with contextlib.suppress(Sql92EvaluationError):
        compiled.evaluate({"a": "5", "b": "x"})
