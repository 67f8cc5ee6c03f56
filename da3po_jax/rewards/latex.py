"""A whitelist parser for the small LaTeX / plain-math subset that final answers use.

Model output is never given to `eval`, `sympify` or `parse_expr`. Instead a hand-written
tokenizer accepts only known tokens, and a recursive-descent parser with hard limits builds a
tiny tuple AST (no sympy involved), which is then either evaluated exactly with `Fraction`s
(`eval_rational`, cheap, used in the parent process) or converted to sympy (`to_sympy`, used
in the scoring worker processes).

Accepted: numbers (`12`, `0.5`), single-letter variables with optional subscripts (`x_1`),
Greek letters, `\\pi`, `e`, `i`, `\\infty`; `+ - * /`, `\\cdot`, `\\times`, `\\div`, `^`,
implicit multiplication (`2\\pi r`, `3\\sqrt{2}`); grouping with `() [] {}`; `\\frac{a}{b}`,
`\\sqrt{x}`, `\\sqrt[n]{x}`; `\\sin \\cos \\tan \\cot \\sec \\csc \\arcsin \\arccos
\\arctan \\sinh \\cosh \\tanh \\ln \\log \\exp` (also without the backslash: `sqrt(2)`).
Everything else (words, relations, `!`, `|x|`, scientific notation) is rejected with
`ParseError`, and the caller falls back to string comparison.

Limits: `MAX_CHARS` characters, `MAX_TOKENS` tokens, nesting depth `MAX_DEPTH`, numeric
literals of at most `MAX_LITERAL_DIGITS` digits; powers with a numeric exponent are only
built when the result stays under `numeric.MAX_BITS` bits (or, for a symbolic or irrational
base, when the exponent is at most `MAX_SYMBOLIC_EXPONENT`). So `9^{9^{9^{9}}}`, deep
nesting and huge exponents fail fast instead of hanging a process.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from da3po_jax.rewards.numeric import MAX_BITS, TooLarge, safe_power

__all__ = ["ParseError", "TooLarge", "eval_rational", "parse_math", "to_sympy"]

MAX_CHARS = 400
MAX_TOKENS = 200
MAX_DEPTH = 40
MAX_LITERAL_DIGITS = 100
MAX_SYMBOLIC_EXPONENT = 100

GREEK = frozenset(
    """
    alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu
    xi rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi
    Omega
""".split()
)
FUNCTIONS = frozenset(
    """
    sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh ln log exp
""".split()
)
_BINARY_COMMANDS = {"cdot": "*", "times": "*", "div": "/"}
_CONSTANTS = {"pi": "pi", "infty": "oo"}
_PLAIN_NAMES = FUNCTIONS | {"sqrt", "pi"}
_TOKEN_RE = re.compile(
    r"(?P<num>\d+(?:\.\d+)?)|(?P<cmd>\\[a-zA-Z]+)|(?P<word>[a-zA-Z]+)"
    r"|(?P<op>[-+*/^()\[\]{}])|(?P<sub>_(?:\{[A-Za-z0-9]{1,4}\}|[A-Za-z0-9]))|(?P<space>\s)"
)

Node = tuple  # ("num", Fraction) | ("sym", name) | ("const", name) | (op, child, ...)


class ParseError(ValueError):
    """The string is outside the accepted math subset."""


def _word_tokens(word: str, out: list[tuple[str, str]]) -> None:
    if word in _PLAIN_NAMES:
        out.append(("name", word))
    elif len(word) >= 3:
        raise ParseError(f"word {word[:20]!r}")
    else:
        out.extend(("sym", c) for c in word)


def _command_token(cmd: str) -> tuple[str, str]:
    name = cmd[1:]
    if name in _BINARY_COMMANDS:
        return ("op", _BINARY_COMMANDS[name])
    if name in _CONSTANTS:
        return ("const", _CONSTANTS[name])
    if name in GREEK:
        return ("sym", name)
    if name in FUNCTIONS or name in ("frac", "sqrt"):
        return ("name", name)
    raise ParseError(f"command {cmd[:20]!r}")


def tokenize(s: str) -> list[tuple[str, str]]:
    """Splits `s` into (kind, text) tokens; raises ParseError on anything not whitelisted."""
    if len(s) > MAX_CHARS:
        raise ParseError("too long")
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if m is None:
            raise ParseError(f"character {s[pos]!r}")
        pos = m.end()
        kind, text = m.lastgroup, m.group()
        if kind == "num":
            if len(text) > MAX_LITERAL_DIGITS or (pos < len(s) and s[pos] in "eE."):
                raise ParseError("number literal")
            out.append(("num", text))
        elif kind == "cmd":
            out.append(_command_token(text))
        elif kind == "word":
            _word_tokens(text, out)
        elif kind == "sub":
            if not out or out[-1][0] != "sym":
                raise ParseError("subscript")
            out[-1] = ("sym", out[-1][1] + text.replace("{", "").replace("}", ""))
        elif kind == "op":
            out.append(("op", text))
        if len(out) > MAX_TOKENS:
            raise ParseError("too many tokens")
    return out


_OPEN = {"(": ")", "[": "]", "{": "}"}


class _Parser:
    """Recursive descent over the token list; every level checks the depth limit."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise ParseError("unexpected end")
        self.pos += 1
        return tok

    def expect(self, text: str) -> None:
        if self.take() != ("op", text):
            raise ParseError(f"expected {text!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    def expr(self) -> Node:
        self.enter()
        node = self.term()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = "add" if self.take()[1] == "+" else "sub"
            node = (op, node, self.term())
        self.depth -= 1
        return node

    def _starts_atom(self) -> bool:
        tok = self.peek()
        return tok is not None and (tok[0] != "op" or tok[1] in _OPEN)

    def term(self) -> Node:
        node = self.unary()
        while True:
            tok = self.peek()
            if tok in (("op", "*"), ("op", "/")):
                self.take()
                node = ("mul" if tok[1] == "*" else "div", node, self.unary())
            elif self._starts_atom():
                node = ("mul", node, self.power())
            else:
                return node

    def unary(self) -> Node:
        self.enter()
        tok = self.peek()
        if tok in (("op", "-"), ("op", "+")):
            self.take()
            inner = self.unary()
            node = ("neg", inner) if tok[1] == "-" else inner
        else:
            node = self.power()
        self.depth -= 1
        return node

    def power(self) -> Node:
        base = self.atom()
        if self.peek() == ("op", "^"):
            self.take()
            return ("pow", base, self.exponent())
        return base

    def exponent(self) -> Node:
        if self.peek() == ("op", "{"):
            return self.group()
        return self.unary()

    def group(self) -> Node:
        open_ = self.take()
        if open_[0] != "op" or open_[1] not in _OPEN:
            raise ParseError("expected a group")
        node = self.expr()
        self.expect(_OPEN[open_[1]])
        return node

    def argument(self) -> Node:
        tok = self.peek()
        if tok in (("op", "{"), ("op", "(")):
            return self.group()
        return self.power()

    def atom(self) -> Node:
        self.enter()
        kind, text = self.take()
        if kind == "num":
            node = ("num", Fraction(text))
        elif kind == "sym":
            node = {"e": ("const", "E"), "i": ("const", "I")}.get(text, ("sym", text))
        elif kind == "const":
            node = ("const", text)
        elif kind == "op" and text in _OPEN:
            self.pos -= 1
            node = self.group()
        elif kind == "name":
            node = self.named(text)
        else:
            raise ParseError(f"unexpected {text!r}")
        self.depth -= 1
        return node

    def named(self, name: str) -> Node:
        if name == "pi":
            return ("const", "pi")
        if name == "frac":
            return ("div", self.argument(), self.argument())
        if name == "sqrt":
            index = None
            if self.peek() == ("op", "["):
                index = self.group()
            return ("sqrt", self.argument(), index)
        if self.peek() == ("op", "^"):  # \sin^2 x
            self.take()
            exponent = self.exponent()
            return ("pow", ("fn", name, self.argument()), exponent)
        return ("fn", name, self.argument())


def parse_math(s: str) -> Node:
    """Parses a normalised answer into a tuple AST.

    Args:
      s: a normalised answer (see `normalize_answer`).

    Returns:
      The AST: `("num", Fraction)`, `("sym", name)`, `("const", "pi" | "E" | "I" | "oo")`,
      `("add" | "sub" | "mul" | "div" | "pow", a, b)`, `("neg", a)`,
      `("sqrt", a, index_or_None)` or `("fn", name, a)`.

    Raises:
      ParseError: if `s` is outside the subset or past a limit.
    """
    tokens = tokenize(s)
    if not tokens:
        raise ParseError("empty")
    parser = _Parser(tokens)
    node = parser.expr()
    if parser.pos != len(tokens):
        raise ParseError(f"trailing {parser.peek()!r}")
    return node


def _rational_power(base: Fraction, exponent: Fraction) -> Fraction | None:
    if exponent.denominator != 1:
        return None  # possibly irrational: leave it to sympy
    return safe_power(base, exponent.numerator)


def eval_rational(node: Node) -> Fraction | None:
    """Exact value of an AST made only of numbers and `+ - * / ^` with integer exponents.

    Returns:
      The value, or None if the AST has symbols, constants, roots or functions, or divides
      by zero.

    Raises:
      TooLarge: if a power would exceed `numeric.MAX_BITS` bits.
    """
    op = node[0]
    if op == "num":
        return node[1]
    if op not in ("add", "sub", "mul", "div", "pow", "neg"):
        return None
    args = [eval_rational(child) for child in node[1:]]
    if any(a is None for a in args):
        return None
    if op == "neg":
        return -args[0]
    a, b = args
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return None if b == 0 else a / b
    if a == 0 and b < 0:
        return None
    return _rational_power(a, b)


def _check_power(base: Any, exponent: Any) -> None:
    """Refuses numeric powers that would build huge numbers (sympy evaluates them eagerly)."""
    if not exponent.is_Rational:
        return
    p, q = int(exponent.p), int(exponent.q)
    if base.is_Rational:
        if base in (0, 1, -1):
            return
        bits = max(int(base.p).bit_length(), int(base.q).bit_length())
        if abs(p) * bits > MAX_BITS or q > MAX_SYMBOLIC_EXPONENT:
            raise TooLarge("numeric power")
    elif abs(p) > MAX_SYMBOLIC_EXPONENT or q > MAX_SYMBOLIC_EXPONENT:
        raise TooLarge("symbolic power")


def to_sympy(node: Node) -> Any:
    """Converts an AST to a sympy expression (imports sympy; used in worker processes).

    Raises:
      TooLarge: if a power would build an oversized number.
    """
    import sympy

    op = node[0]
    if op == "num":
        return sympy.Rational(node[1].numerator, node[1].denominator)
    if op == "sym":
        return sympy.Symbol(node[1])
    if op == "const":
        return {"pi": sympy.pi, "E": sympy.E, "I": sympy.I, "oo": sympy.oo}[node[1]]
    if op == "fn":
        return getattr(
            sympy,
            {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "ln": "log"}.get(
                node[1], node[1]
            ),
        )(to_sympy(node[2]))
    if op == "sqrt":
        if node[2] is None:
            return sympy.sqrt(to_sympy(node[1]))
        index = to_sympy(node[2])
        if index.is_Rational and max(abs(int(index.p)), int(index.q)) > MAX_SYMBOLIC_EXPONENT:
            raise TooLarge("root index")
        return sympy.root(to_sympy(node[1]), index)
    if op == "neg":
        return -to_sympy(node[1])
    a, b = to_sympy(node[1]), to_sympy(node[2])
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    _check_power(a, b)
    return a**b
