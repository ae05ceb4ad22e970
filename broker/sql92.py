"""SQL92 property filters: RocketMQ's message selector language, parsed with lark and
evaluated over a message's properties.

The language is RocketMQ 4.9's (`filter/parser/SelectorParser.jj`, the ActiveMQ
selector grammar without LIKE and arithmetic). Lowest precedence first:

    OR
    AND
    =  <>  IS [NOT] NULL
    >  >=  <  <=  [NOT] BETWEEN x AND y  [NOT] IN ('s', ...)
    unary +  -  NOT
    literal, property, ( ... )

Literals: 'single-quoted' strings ('' is a quote), integers (int32, else int64; an L
suffix is allowed), decimals (5.  5.5  .5  5E10), TRUE, FALSE, NULL. Keywords are
case-insensitive; property names are `[A-Za-z_$][A-Za-z0-9_$]*`, case-sensitive.
Comments: `-- to the end of the line` and `/* ... */`. NOT is unary: `NOT a = 1` is
`(NOT a) = 1`; write `NOT (a = 1)`.

Evaluation follows `filter/expression/*`: every property value is a string; a
comparison with a number converts the string to that number's type (int32, int64 or
double, as Java's `Integer.valueOf`/`Long.valueOf`/`Double.valueOf` parse it), a
comparison with TRUE/FALSE reads it as Java's `Boolean.valueOf`; two strings under
`< <= > >=` are both read as doubles. An absent property is NULL, and NULL
propagates through comparisons and SQL's three-valued AND/OR/NOT. A message matches
only when the whole expression is TRUE: NULL, FALSE and a conversion failure ("abc" >
5) all skip it.

Two differences from RocketMQ, both where it is inconsistent: `0.0` (and any decimal
that rounds to zero) is a valid literal here (Java rejects every decimal below
Double.MIN_VALUE, zero included), and `TRUE = a` means what `a = TRUE` means (Java
throws a ClassCastException when the boolean is on the left, so it never matches).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping

import attrs
from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from raftmq.protocol.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, string_to_properties

__all__ = ["Sql92Error", "Sql92EvaluationError", "Sql92Filter", "compile_sql92"]

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1
COMPILED_CACHE_SIZE = 1024  # expressions, good or bad (RocketMQ caches 100)
# Operators nested in one another (a chain of ANDs counts each); evaluation recurses
# once per level, so this keeps it far from Python's recursion limit.
MAX_NESTING = 400
SHOWN_CHARS = 60  # how much of a sub-expression an error message quotes
LONG_DIGITS = 19  # int() refuses very long digit strings; a long has at most 19 digits
RESULTS_CACHED = 256  # per expression: results by the items it reads (Sql92Filter)
RESULT_KEY_MAX_BYTES = 256  # longer items are evaluated each time, not kept
_SEPARATOR_BYTES = PROPERTY_SEPARATOR.encode()


class Sql92Error(ValueError):
    """An expression that does not compile; the message names the problem and where."""


class Sql92EvaluationError(ValueError):
    """A value that cannot be converted for a comparison ("abc" > 5): no match."""


_KEYWORD_END = r"(?![a-z0-9_$])"  # a keyword is not the start of a longer name ("nota")
GRAMMAR = rf"""
?start: or_expr
?or_expr: and_expr
        | or_expr _OR and_expr -> or_
?and_expr: equality
         | and_expr _AND equality -> and_
?equality: comparison
         | equality _EQ comparison -> eq
         | equality _NE comparison -> ne
         | equality _IS _NULL -> is_null
         | equality _IS _NOT _NULL -> is_not_null
?comparison: unary
           | comparison _GT unary -> gt
           | comparison _GE unary -> ge
           | comparison _LT unary -> lt
           | comparison _LE unary -> le
           | comparison _BETWEEN unary _AND unary -> between
           | comparison _NOT _BETWEEN unary _AND unary -> not_between
           | comparison _IN _LPAR STRING (_COMMA STRING)* _RPAR -> in_
           | comparison _NOT _IN _LPAR STRING (_COMMA STRING)* _RPAR -> not_in
?unary: primary
      | _PLUS unary
      | _MINUS unary -> negate
      | _NOT unary -> not_
?primary: STRING -> string
        | DECIMAL -> decimal
        | FLOAT -> floating
        | _TRUE -> true
        | _FALSE -> false
        | _NULL -> null
        | ID -> property
        | _LPAR or_expr _RPAR
_NOT.2: /not{_KEYWORD_END}/i
_AND.2: /and{_KEYWORD_END}/i
_OR.2: /or{_KEYWORD_END}/i
_BETWEEN.2: /between{_KEYWORD_END}/i
_IN.2: /in{_KEYWORD_END}/i
_IS.2: /is{_KEYWORD_END}/i
_TRUE.2: /true{_KEYWORD_END}/i
_FALSE.2: /false{_KEYWORD_END}/i
_NULL.2: /null{_KEYWORD_END}/i
FLOAT.3: /([0-9]+\.[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?|[0-9]+e[+-]?[0-9]+/i
DECIMAL: /(0|[1-9][0-9]*)l?/i
STRING: /'(''|[^'])*'/
ID: /[a-z_$][a-z0-9_$]*/i
_EQ: "="
_NE: "<>"
_GT: ">"
_GE: ">="
_LT: "<"
_LE: "<="
_LPAR: "("
_RPAR: ")"
_COMMA: ","
_PLUS: "+"
_MINUS: "-"
COMMENT: /--[^\n\r]*/ | /\/\*(.|\n)*?\*\//
%ignore /[ \t\n\r\f]+/
%ignore COMMENT
"""

# What a parse error says was expected, by terminal name.
_EXPECTED_NAMES = {
    "_OR": "OR", "_AND": "AND", "_NOT": "NOT", "_BETWEEN": "BETWEEN", "_IN": "IN",
    "_IS": "IS", "_TRUE": "TRUE", "_FALSE": "FALSE", "_NULL": "NULL", "FLOAT": "a number",
    "DECIMAL": "a number", "STRING": "a 'string'", "ID": "a property name", "_EQ": "=",
    "_NE": "<>", "_GT": ">", "_GE": ">=", "_LT": "<", "_LE": "<=", "_LPAR": "(",
    "_RPAR": ")", "_COMMA": ",", "_PLUS": "+", "_MINUS": "-", "$END": "the end",
}  # fmt: skip

_PARSER = Lark(GRAMMAR, parser="lalr", lexer="basic", propagate_positions=True)


# --- values: Java's types, as Python values ---------------------------------------------


class Long(int):
    """A Java long constant; a plain int is a Java int. They compare as numbers, but a
    property string compared with one is parsed to its type (int32 vs int64 range)."""

    __slots__ = ()

    def __neg__(self) -> Long:
        return Long(-int(self))


_JAVA_TRIMMED = "".join(map(chr, range(33)))  # what String.trim removes
_INTEGER = re.compile(r"[+-]?\d+")
_DOUBLE = re.compile(
    r"[+-]?(NaN|Infinity|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?[fFdD]?)"
    r"|[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?\d+[fFdD]?",
    re.ASCII,
)


def _java_int(text: str, low: int, high: int, kind: type) -> int:
    """`Integer.valueOf` / `Long.valueOf`: sign and digits only, in range."""
    if len(text) <= LONG_DIGITS + 1 and _INTEGER.fullmatch(text):
        value = int(text)
        if low <= value <= high:
            return kind(value)
    raise Sql92EvaluationError(f"{text!r} is not a {'long' if kind is Long else 'int'}")


def _java_double(text: str) -> float:
    """`Double.valueOf`: Java's float syntax (NaN, Infinity, a type suffix, hex), after
    trimming control characters and spaces as `String.trim` does."""
    trimmed = text.strip(_JAVA_TRIMMED)
    match = _DOUBLE.fullmatch(trimmed)
    if match is None:
        raise Sql92EvaluationError(f"{text!r} is not a double")
    number = trimmed.rstrip("fFdD")  # one type suffix at most, after a digit or "."
    if match.group(4) is not None:  # hexadecimal: 0x1.8p1
        return float.fromhex(number)
    return float(number.replace("Infinity", "inf"))


def _java_double_compare(a: float, b: float) -> int:
    """`Double.compare`: NaN above everything and equal to itself, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    a_nan, b_nan = math.isnan(a), math.isnan(b)
    if a_nan or b_nan:
        return int(a_nan) - int(b_nan)
    a_sign, b_sign = math.copysign(1, a), math.copysign(1, b)
    return (a_sign > b_sign) - (a_sign < b_sign)


def _convert(text: str, like: object) -> object:
    """A property string as the type of the value it is compared with."""
    kind = type(like)
    if kind is bool:
        return text.lower() == "true"
    if kind is int:
        return _java_int(text, INT_MIN, INT_MAX, int)
    if kind is Long:
        return _java_int(text, LONG_MIN, LONG_MAX, Long)
    return _java_double(text)


def _compare(left: object, right: object) -> int:
    """`ComparisonExpression.__compare` for two non-NULL values: <0, 0, >0; a boolean
    and a number do not compare, which Java answers -1."""
    left_type, right_type = type(left), type(right)
    if left_type is str and right_type is not str:
        left = _convert(left, right)
    elif right_type is str and left_type is not str:
        right = _convert(right, left)
    elif (left_type is bool) != (right_type is bool):
        return -1
    if type(left) is float or type(right) is float:
        return _java_double_compare(float(left), float(right))
    return (left > right) - (left < right)


# --- the expression tree ----------------------------------------------------------------


def _shown(text: str) -> str:
    """`text`, cut short for an error message."""
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


Evaluate = Callable[[Mapping[str, str]], object]


@attrs.frozen
class _Node:
    """One parsed sub-expression: how to evaluate it, and what the parse-time checks
    need to know about it (RocketMQ's ConstantExpression / BooleanExpression /
    PropertyExpression classes)."""

    evaluate: Evaluate
    text: str = attrs.field(converter=_shown)  # Java's toString, for error messages
    line: int
    column: int
    constant: bool = False  # a literal: `value` holds it
    boolean: bool = False  # gives TRUE, FALSE or NULL (comparisons, logic, TRUE/FALSE/NULL)
    property: bool = False
    value: object = None  # a literal's value; a property's name


def _constant(value: object, text: str, meta, boolean: bool = False) -> _Node:
    return _Node(lambda _props: value, text, meta.line, meta.column, True, boolean, value=value)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _unquote(token: Token) -> str:
    return token[1:-1].replace("''", "'")


def _where(line: int, column: int) -> str:
    return f"column {column}" if line == 1 else f"line {line}, column {column}"


def _error(line: int, column: int, problem: str) -> Sql92Error:
    return Sql92Error(f"{_where(line, column)}: {problem}")


def _fail(node: _Node, problem: str):
    raise _error(node.line, node.column, problem)


def _as_condition(node: _Node) -> Evaluate:
    """SelectorParser.asBooleanExpression: conditions as they are, a bare property as
    a boolean cast (NULL if absent, else FALSE: its value is a string), else an error."""
    if node.boolean:
        return node.evaluate
    if node.property:
        name = node.value
        return lambda props: None if props.get(name) is None else False
    _fail(node, f"{node.text} is not a condition (it gives no TRUE or FALSE)")


def _check_orderable(node: _Node, operator: str) -> None:
    """`< <= > >=` take numbers and properties only (checkLessThanOperand)."""
    if (node.constant and type(node.value) not in (int, Long, float)) or node.boolean:
        _fail(node, f"{node.text} cannot be compared with {operator}: only numbers can")


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _ordering(left: _Node, right: _Node, operator: str, meta) -> _Node:
    _check_orderable(left, operator)
    _check_orderable(right, operator)
    accept = _ORDERINGS[operator]
    left_eval, right_eval = left.evaluate, right.evaluate

    def evaluate(props):
        lv = left_eval(props)
        rv = None if lv is None else right_eval(props)  # NULL on the left: right unread
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:  # two properties: both must be numbers
            lv, rv = _java_double(lv), _java_double(rv)
        return accept(_compare(lv, rv))

    text = f"({left.text} {operator} {right.text})"
    return _Node(evaluate, text, meta.line, meta.column, boolean=True)


def _equal_unchecked(left: _Node, right: _Node, meta) -> _Node:
    left_eval, right_eval = left.evaluate, right.evaluate

    def evaluate(props):
        lv, rv = left_eval(props), right_eval(props)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        return _compare(lv, rv) == 0

    return _Node(evaluate, f"({left.text} = {right.text})", meta.line, meta.column, boolean=True)


def _equal(left: _Node, right: _Node, meta) -> _Node:
    for node in (left, right):
        if node.constant and node.value is None:
            _fail(node, "NULL cannot be compared with = or <>: use IS NULL or IS NOT NULL")
    if left.constant and right.constant and left.boolean and not right.boolean:
        _fail(left, f"{left.text} cannot be compared with {right.text}")
    return _equal_unchecked(left, right, meta)


def _not(node: _Node, meta) -> _Node:
    inner = _as_condition(node)

    def evaluate(props):
        value = inner(props)
        return None if value is None else not value

    return _Node(evaluate, f"(NOT {node.text})", meta.line, meta.column, boolean=True)


def _logic(left: _Node, right: _Node, meta, dominant: bool) -> _Node:
    """AND (dominant FALSE) or OR (dominant TRUE), SQL's three-valued logic, evaluated
    left to right and stopping at a dominant value, as LogicExpression does."""
    left_eval, right_eval = _as_condition(left), _as_condition(right)

    def evaluate(props):
        lv = left_eval(props)
        if lv is dominant:
            return dominant
        rv = right_eval(props)
        if rv is dominant:
            return dominant
        return None if lv is None or rv is None else not dominant

    word = "OR" if dominant else "AND"
    return _Node(
        evaluate, f"({left.text} {word} {right.text})", meta.line, meta.column, boolean=True
    )


def _membership(left: _Node, strings: list[Token], meta, negated: bool) -> _Node:
    if not left.property:
        _fail(left, f"IN needs a property on its left, not {left.text}")
    name, values = left.value, frozenset(_unquote(s) for s in strings)

    def evaluate(props):
        value = props.get(name)
        return None if value is None else (value in values) != negated

    listed = ", ".join(_quote(_unquote(s)) for s in strings)
    text = f"{name} {'NOT IN' if negated else 'IN'} ({listed})"
    return _Node(evaluate, text, meta.line, meta.column, boolean=True)


@v_args(meta=True)
class _Build(Transformer_NonRecursive):
    """Parse tree -> _Node, with RocketMQ's parse-time checks."""

    def string(self, meta, children):
        value = _unquote(children[0])
        return _constant(value, _quote(value), meta)

    def decimal(self, meta, children):
        digits = children[0].rstrip("lL")
        value = int(digits) if len(digits) <= LONG_DIGITS else LONG_MAX + 1
        if value > LONG_MAX:
            raise _error(meta.line, meta.column, f"{_shown(digits)} does not fit in a long")
        return _constant(value if value <= INT_MAX else Long(value), digits, meta)

    def floating(self, meta, children):
        value = float(children[0])
        if math.isinf(value):
            problem = f"{_shown(children[0])} is beyond the range of a double"
            raise _error(meta.line, meta.column, problem)
        return _constant(value, str(children[0]), meta)

    def true(self, meta, children):
        return _constant(True, "TRUE", meta, boolean=True)

    def false(self, meta, children):
        return _constant(False, "FALSE", meta, boolean=True)

    def null(self, meta, children):
        return _constant(None, "NULL", meta, boolean=True)

    def property(self, meta, children):
        name = str(children[0])
        return _Node(
            lambda props: props.get(name), name, meta.line, meta.column, property=True, value=name
        )

    def negate(self, meta, children):
        (node,) = children
        inner = node.evaluate

        def evaluate(props):
            value = inner(props)
            return -value if type(value) in (int, Long, float) else None

        return _Node(evaluate, f"-{node.text}", meta.line, meta.column)

    def not_(self, meta, children):
        return _not(children[0], meta)

    def gt(self, meta, children):
        return _ordering(*children, ">", meta)

    def ge(self, meta, children):
        return _ordering(*children, ">=", meta)

    def lt(self, meta, children):
        return _ordering(*children, "<", meta)

    def le(self, meta, children):
        return _ordering(*children, "<=", meta)

    def between(self, meta, children):
        value, low, high = children
        if low.constant and high.constant:
            if low.value is None or high.value is None:
                _fail(low, "the bounds of BETWEEN cannot be NULL")
            numbers = (int, Long, float)
            if (
                type(low.value) in numbers
                and type(high.value) in numbers
                and _compare(high.value, low.value) < 0
            ):
                _fail(low, f"BETWEEN {low.text} AND {high.text}: the low bound is the higher")
        at_least, at_most = _ordering(value, low, ">=", meta), _ordering(value, high, "<=", meta)
        return _logic(at_least, at_most, meta, False)

    def not_between(self, meta, children):
        value, low, high = children
        below, above = _ordering(value, low, "<", meta), _ordering(value, high, ">", meta)
        return _logic(below, above, meta, True)

    def in_(self, meta, children):
        return _membership(children[0], children[1:], meta, negated=False)

    def not_in(self, meta, children):
        return _membership(children[0], children[1:], meta, negated=True)

    def eq(self, meta, children):
        return _equal(*children, meta)

    def ne(self, meta, children):
        return _not(_equal(*children, meta), meta)

    def is_null(self, meta, children):
        return _equal_unchecked(children[0], _constant(None, "NULL", meta, True), meta)

    def is_not_null(self, meta, children):
        return _not(self.is_null(meta, children), meta)

    def and_(self, meta, children):
        return _logic(*children, meta, False)

    def or_(self, meta, children):
        return _logic(*children, meta, True)


def _parse_error(text: str, exc: UnexpectedInput) -> Sql92Error:
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream]
        if char == "'":
            return _error(exc.line, exc.column, "a 'string' without its closing quote")
        return _error(exc.line, exc.column, f"unexpected character {char!r}")
    expected = sorted({_EXPECTED_NAMES.get(name, name) for name in exc.expected or ()})
    wanted = f"; expected {', '.join(expected)}" if expected else ""
    if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        return _error(exc.line, exc.column, f"unexpected {_shown(str(exc.token))!r}{wanted}")
    line, column = text.count("\n") + 1, len(text) - text.rfind("\n")
    return _error(line, column, f"the expression ends too early{wanted}")


@attrs.frozen
class Sql92Filter:
    """A compiled expression. `matches_properties` is what the broker asks per message.

    Its results are cached by the items of the properties it reads, as stored
    (`a\x017` for `a > 5`): a message's whole properties never repeat (its UNIQ_KEY
    is its own), but the values a filter reads mostly do. Bounded: RESULTS_CACHED
    keys of at most RESULT_KEY_MAX_BYTES each, the whole forgotten when full."""

    expression: str
    _evaluate: Evaluate = attrs.field(repr=False)
    names: frozenset[str]  # the properties it reads
    _results: dict[bytes, bool] = attrs.field(init=False, factory=dict, repr=False, eq=False)
    # What starts an item of each of them in a properties string with a \x02 in front
    _item_starts: tuple[bytes, ...] = attrs.field(init=False, repr=False, eq=False)

    @_item_starts.default
    def _starts(self) -> tuple[bytes, ...]:
        return tuple(f"{PROPERTY_SEPARATOR}{name}{NAME_VALUE_SEPARATOR}".encode() for name in
                     sorted(self.names))  # fmt: skip

    def evaluate(self, properties: Mapping[str, str]) -> bool | None:
        """TRUE, FALSE or NULL (None); Sql92EvaluationError when a property value does
        not convert for a comparison."""
        return self._evaluate(properties)

    def matches(self, properties: Mapping[str, str]) -> bool:
        """TRUE only; a value that does not convert is no match, as RocketMQ has it.
        Anything else raised is a fault here and is raised: a pull answers it
        SYSTEM_ERROR instead of skipping the consumer past messages it wants (RocketMQ
        logs every Throwable of an evaluation and skips the message)."""
        try:
            return self._evaluate(properties) is True
        except Sql92EvaluationError:
            return False

    def matches_properties(self, properties: bytes) -> bool:
        """`matches` over a stored record's raw PROPERTIES bytes (what a pull's scan
        gives it), read as RocketMQ's MessageDecoder reads them: the items of the
        properties it reads are all that decides, so they are what it parses."""
        key = self._items_read(properties)
        result = self._results.get(key)
        if result is None:
            result = self.matches(string_to_properties(key.decode("utf-8", "replace")))
            if len(key) <= RESULT_KEY_MAX_BYTES:
                if len(self._results) >= RESULTS_CACHED:
                    self._results.clear()
                self._results[key] = result
        return result

    def _items_read(self, properties: bytes) -> bytes:
        """The items of `names` that `string_to_properties` would keep (of each the last
        with a value), as a properties string. Found in the bytes, not decoded: the
        separators are ASCII, which UTF-8 decoding keeps in place whatever surrounds
        them, so the items decode to what they would in the whole."""
        text = _SEPARATOR_BYTES + properties
        items = []
        for item_start in self._item_starts:
            at = text.rfind(item_start)
            while at >= 0:
                value_at = at + len(item_start)
                end = text.find(_SEPARATOR_BYTES, value_at)
                if end < 0:
                    end = len(text)
                if end > value_at:
                    items.append(text[at + 1 : end])
                    break
                at = text.rfind(item_start, 0, at)
        return _SEPARATOR_BYTES.join(items)


def _nesting(tree: Tree) -> int:
    """How deep the parse tree is, found without recursion."""
    deepest, pending = 0, [(tree, 1)]
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        pending += [(child, depth + 1) for child in node.children if isinstance(child, Tree)]
    return deepest


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def _compile(expression: str) -> Sql92Filter | Sql92Error:
    if not expression.strip():
        return Sql92Error("the expression is empty")
    try:
        tree = _PARSER.parse(expression)
        if _nesting(tree) > MAX_NESTING:
            return Sql92Error(f"the expression nests more than {MAX_NESTING} operators")
        names = frozenset(
            str(child)
            for subtree in tree.iter_subtrees()
            for child in subtree.children
            if isinstance(child, Token) and child.type == "ID"
        )
        return Sql92Filter(expression, _as_condition(_Build().transform(tree)), names)
    except UnexpectedInput as exc:
        return _parse_error(expression, exc)
    except VisitError as exc:
        if isinstance(exc.orig_exc, Sql92Error):
            return exc.orig_exc
        raise
    except Sql92Error as exc:
        return exc


def compile_sql92(expression: str) -> Sql92Filter:
    """The filter for `expression`, compiled once and cached by its text (errors too);
    Sql92Error, naming the problem and its position, when it does not compile."""
    compiled = _compile(expression)
    if isinstance(compiled, Sql92Error):
        raise compiled
    return compiled
