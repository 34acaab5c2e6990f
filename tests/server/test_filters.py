"""protocol.filters: the filter language of docs/protocol.md §7 (golden cases, NULL logic, malformed text).

Golden cases are ``(filter, body, expected)``: the predicate must return exactly ``expected``
(a real ``bool``). Malformed cases are ``(filter, position, words in the detail)``.
"""

import pickle
import random
import sys
import time

import pytest

from protocol.filters import (
    MAX_FILTER_DEPTH,
    MAX_FILTER_TEXT,
    FilterError,
    compile_body_filter,
    compile_filter,
)


def check(text, body, expected):
    result = compile_filter(text)(body)
    assert result is expected, f"{text!r} on {body!r} gave {result!r}, expected {expected!r}"


# --------------------------------------------------------------------------------------------
# golden cases, one group per feature

COMPARISONS = [
    ("/a = 'x'", {"a": "x"}, True),
    ("/a = 'x'", {"a": "y"}, False),
    ("/a = 'x'", {"a": "X"}, False),  # case-sensitive
    ("/a == 'x'", {"a": "x"}, True),
    ("/a != 'x'", {"a": "y"}, True),
    ("/a != 'x'", {"a": "x"}, False),
    ("/a <> 'x'", {"a": "y"}, True),
    ("/a <> 'x'", {"a": "x"}, False),
    ("/n < 5", {"n": 4}, True),
    ("/n < 5", {"n": 5}, False),
    ("/n <= 5", {"n": 5}, True),
    ("/n <= 5", {"n": 6}, False),
    ("/n > 5", {"n": 6}, True),
    ("/n > 5", {"n": 5}, False),
    ("/n >= 5", {"n": 5}, True),
    ("/n >= 5", {"n": 4}, False),
    ("/n = 5", {"n": 5.0}, True),
    ("/n = 0.5", {"n": 0.5}, True),
    ("/n > 1e3", {"n": 1001}, True),
    ("/n > 1E3", {"n": 999}, False),
    ("/n = .5", {"n": 0.5}, True),
    ("/n = 2.", {"n": 2}, True),
    ("/n = 1.5e-3", {"n": 0.0015}, True),
    ("5 > /n", {"n": 4}, True),  # literal on the left
    ("5 > /n", {"n": 6}, False),
    ("'b' >= /s", {"s": "a"}, True),
    ("/a = /b", {"a": 3, "b": 3}, True),
    ("/a = /b", {"a": 3, "b": 4}, False),
    ("/a < /b", {"a": "abc", "b": "abd"}, True),
    ("/s < 'b'", {"s": "a"}, True),
    ("/s < 'b'", {"s": "ba"}, False),
    ("/s > 'B'", {"s": "a"}, True),  # code point order
    ("/a = ''", {"a": ""}, True),  # the empty string is a value, not NULL
    ('/a = "x"', {"a": "x"}, True),
    ("/a = 'it''s'", {"a": "it's"}, True),
    ('/a = "say ""hi"""', {"a": 'say "hi"'}, True),
    ("/a = 'say \"hi\"'", {"a": 'say "hi"'}, True),
    ("/a = 'back\\slash'", {"a": "back\\slash"}, True),  # no backslash escapes
    ("/a = 'é€'", {"a": "é€"}, True),
    ("/a = 12345678901234567890123", {"a": 12345678901234567890123}, True),  # exact big ints
    ("/a = 12345678901234567890123", {"a": 12345678901234567890124}, False),
]

BOOLEANS = [
    ("/f = TRUE", {"f": True}, True),
    ("/f = TRUE", {"f": False}, False),
    ("/f = FALSE", {"f": False}, True),
    ("/f != TRUE", {"f": False}, True),
    ("/f = true", {"f": True}, True),
    ("/f = True", {"f": True}, True),
    ("/f = TRUE", {"f": 1}, False),  # a number is not a boolean
    ("/f = 1", {"f": True}, False),
    ("/f != 1", {"f": True}, True),
    ("/f = 'true'", {"f": True}, False),
    ("/f > FALSE", {"f": True}, False),  # booleans are not ordered: UNKNOWN
    ("NOT (/f > FALSE)", {"f": True}, False),
    ("/f", {"f": True}, True),  # a bare value is a condition when it is a boolean
    ("/f", {"f": False}, False),
    ("NOT /f", {"f": False}, True),
    ("NOT /f", {"f": True}, False),
    ("/f", {"f": 1}, False),
    ("NOT /f", {"f": 1}, False),  # a non-boolean is UNKNOWN as a condition
    ("NOT /f", {}, False),
    ("TRUE", {}, True),
    ("FALSE", {}, False),
    ("NOT FALSE", {}, True),
    ("/f AND /g", {"f": True, "g": True}, True),
    ("/f AND /g", {"f": True, "g": False}, False),
]

LOGIC = [
    ("/a = 1 AND /b = 2", {"a": 1, "b": 2}, True),
    ("/a = 1 AND /b = 2", {"a": 1, "b": 3}, False),
    ("/a = 1 AND /b = 2", {"a": 0, "b": 2}, False),
    ("/a = 1 OR /b = 2", {"a": 0, "b": 2}, True),
    ("/a = 1 OR /b = 2", {"a": 1, "b": 0}, True),
    ("/a = 1 OR /b = 2", {"a": 0, "b": 0}, False),
    ("NOT /a = 1", {"a": 2}, True),
    ("NOT /a = 1", {"a": 1}, False),
    ("NOT NOT /a = 1", {"a": 1}, True),
    ("NOT (NOT (NOT /a = 1))", {"a": 1}, False),
    ("/a = 1 and /b = 2 or /c = 3", {"c": 3}, True),  # keywords in any case
    ("/a = 1 And Not /b = 2", {"a": 1, "b": 3}, True),
    ("/a = 1 AND /b = 2 AND /c = 3 AND /d = 4", {"a": 1, "b": 2, "c": 3, "d": 4}, True),
    ("/a = 1 AND /b = 2 AND /c = 3 AND /d = 4", {"a": 1, "b": 2, "c": 3, "d": 5}, False),
    ("/a = 1 OR /b = 2 OR /c = 3 OR /d = 4", {"d": 4}, True),
    ("/a = 1 OR /b = 2 OR /c = 3 OR /d = 4", {"d": 5}, False),
    ("/a='x'AND/b='y'", {"a": "x", "b": "y"}, True),  # no spaces needed around quotes
    ("(/a=1)OR(/b=2)", {"b": 2}, True),
    ("\t/a\n=\r\n1 ", {"a": 1}, True),
]

PRECEDENCE = [
    # AND binds tighter than OR: a OR (b AND c)
    ("/a = 1 OR /b = 1 AND /c = 1", {"a": 1, "b": 0, "c": 0}, True),
    ("(/a = 1 OR /b = 1) AND /c = 1", {"a": 1, "b": 0, "c": 0}, False),
    ("/b = 1 AND /c = 1 OR /a = 1", {"a": 1, "b": 0, "c": 0}, True),
    # NOT binds tighter than AND, looser than comparison: (NOT a=1) AND b=1
    ("NOT /a = 1 AND /b = 1", {"a": 2, "b": 0}, False),
    ("NOT (/a = 1 AND /b = 1)", {"a": 2, "b": 0}, True),
    ("NOT /a = 1 OR /b = 1", {"a": 1, "b": 1}, True),
    # arithmetic: * / % over + -, left to right within a level, unary minus tightest
    ("1 + 2 * 3 = 7", {}, True),
    ("(1 + 2) * 3 = 9", {}, True),
    ("10 - 4 - 3 = 3", {}, True),
    ("10 - (4 - 3) = 9", {}, True),
    ("100 / 10 / 5 = 2", {}, True),
    ("2 * 3 % 4 = 2", {}, True),
    ("2 * (3 % 4) = 6", {}, True),
    ("-2 * 3 = -6", {}, True),
    ("- 2 - 3 = -5", {}, True),
    ("-(2 - 3) = 1", {}, True),
    ("- -2 = 2", {}, True),
    ("+2 = 2", {}, True),
    ("/a + 1 > 2 AND /b = 1", {"a": 2, "b": 1}, True),  # arithmetic inside a comparison
    ("/a = 1 + 1", {"a": 2}, True),
    ("/a * 2 = /b + 2", {"a": 3, "b": 4}, True),
    ("/a BETWEEN 1 AND 3 AND /b = 1", {"a": 2, "b": 1}, True),  # BETWEEN's AND is its own
    ("/a BETWEEN 1 AND 3 AND /b = 1", {"a": 2, "b": 2}, False),
    ("/a BETWEEN 1 AND 1 + 2", {"a": 3}, True),
    ("/a BETWEEN 1 AND 3 OR /b = 1", {"a": 9, "b": 1}, True),
]

ARITHMETIC = [
    ("/a + /b = 5", {"a": 2, "b": 3}, True),
    ("/a - /b = -1", {"a": 2, "b": 3}, True),
    ("/a * /b = 6", {"a": 2, "b": 3}, True),
    ("/a / 2 = 3", {"a": 7}, True),  # integer division truncates, as in AMPS
    ("/a / 2 = 3.5", {"a": 7.0}, True),
    ("/a / 2 = 3.5", {"a": 7}, False),
    ("-7 / 2 = -3", {}, True),  # toward zero, not floor
    ("7 / -2 = -3", {}, True),
    ("-7 % 2 = -1", {}, True),  # sign of the dividend
    ("7 % -2 = 1", {}, True),
    ("7 % 3 = 1", {}, True),
    ("5.5 % 2 = 1.5", {}, True),
    ("7 MOD 3 = 1", {}, True),
    ("7 mod 3 = 1", {}, True),
    ("10/2 = 5", {}, True),  # division without spaces after a number
    ("/a / /b = 2", {"a": 10, "b": 5}, True),
    ("/a + 0.5 = 2.5", {"a": 2}, True),
    ("/a + 1 = 3", {"a": "2"}, True),  # numeric strings take part in arithmetic
    ("/a + 1 = 3", {"a": "x"}, False),
    ("-/a = -7", {"a": 7}, True),
    ("-/a = -7", {"a": "7"}, True),
    ("-/a = -7", {"a": "x"}, False),
    ("(/a / 0) IS NULL", {"a": 1}, True),  # division by zero is NULL
    ("(/a % 0) IS NULL", {"a": 1}, True),
    ("(/a / 0.0) IS NULL", {"a": 1.0}, True),
    ("/a / 0 = 0", {"a": 1}, False),
    ("NOT (/a / 0 = 0)", {"a": 1}, False),
    ("(/a + 1) IS NULL", {}, True),
    ("(/a + 1) IS NULL", {"a": True}, True),  # booleans are not numbers
    ("(/a + 1) IS NULL", {"a": [1]}, True),
    ("(/a + 1) IS NULL", {"a": {"b": 1}}, True),
    ("/a * 1.5 > 0", {"a": 10**400}, False),  # int too large for a float: NULL, no error
    ("(/a * 1.5) IS NULL", {"a": 10**400}, True),
    ("/a * /a > 0", {"a": 10**150}, True),  # big, but a float holds it
    ("(/a * /a * /a) IS NULL", {"a": 10**300}, True),  # beyond the float range
    ("/a * 2 = 36893488147419103232", {"a": 2**64}, True),  # big ints become floats
    ("/a - /a = 0", {"a": 1e308}, True),
    ("1e999 > 1e308", {}, True),  # float literals overflow to infinity
]

PATHS = [
    ("/a/b = 1", {"a": {"b": 1}}, True),
    ("/a/b/c = 'deep'", {"a": {"b": {"c": "deep"}}}, True),
    ("/a/b = 1", {"a": {"c": 1}}, False),
    ("/a/b IS NULL", {"a": 5}, True),  # a path through a scalar is NULL
    ("/a/b IS NULL", {"a": "str"}, True),
    ("/a/b IS NULL", {"a": [1]}, True),
    ("/arr[0] = 10", {"arr": [10, 20]}, True),
    ("/arr[1] = 20", {"arr": [10, 20]}, True),
    ("/arr[2] IS NULL", {"arr": [10, 20]}, True),  # out of range
    ("/arr[0] IS NULL", {"arr": []}, True),
    ("/arr[0] IS NULL", {"arr": "abc"}, True),  # strings are not indexable
    ("/arr[0] IS NULL", {"arr": {"0": 1}}, True),  # an index needs an array
    ("/arr/0 = 1", {"arr": {"0": 1}}, True),  # a digit name is a key
    ("/a[1]/b = 'x'", {"a": [{"b": "y"}, {"b": "x"}]}, True),
    ("/m[1][0] = 3", {"m": [[1, 2], [3, 4]]}, True),
    ("/a/b[0]/c[1] = 7", {"a": {"b": [{"c": [6, 7]}]}}, True),
    ("/55 = 'fix'", {"55": "fix"}, True),
    ("/_x = 1", {"_x": 1}, True),
    ("/a.b = 1", {"a.b": 1}, True),
    ("/@id = 1", {"@id": 1}, True),
    ("/$v = 1", {"$v": 1}, True),
    ("/ü = 1", {"ü": 1}, True),
    ("/and = 1", {"and": 1}, True),  # keywords are fine as names
    ("/a/b/c/d/e/f/g = 1", {"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}}, True),
    ("/a = NULL", {"a": None}, False),
    ("/a IS NULL", {"a": None}, True),  # JSON null is NULL
    ("/a IS NOT NULL", {"a": None}, False),
    ("/a IS NOT NULL", {"a": 0}, True),
    ("/a IS NOT NULL", {"a": ""}, True),
    ("/a IS NOT NULL", {"a": []}, True),
    ("/a IS NOT NULL", {"a": {}}, True),
    ("/a is not null", {"a": False}, True),
]

NON_OBJECT_BODIES = [
    ("/a = 1", None, False),
    ("/a = 1", [1, 2], False),
    ("/a = 1", "a", False),
    ("/a = 1", 1, False),
    ("/a = 1", True, False),
    ("/a IS NULL", [1], True),  # nothing at /a
    ("/a IS NULL", "text", True),
    ("/a/b IS NULL", None, True),
    ("/a[0] IS NULL", [[1]], True),
    ("NOT /a = 1", [1], False),
    ("1 = 1", "anything", True),
]

COERCION = [
    ("/a = 5", {"a": "5"}, True),  # number vs numeric string: numerically
    ("/a = '5'", {"a": 5}, True),
    ("/a = '5.0'", {"a": 5}, True),
    ("/a = 5", {"a": "5.0"}, True),
    ("/a = 5", {"a": "05"}, True),
    ("/a = 5", {"a": "+5"}, True),
    ("/a = -5", {"a": "-5"}, True),
    ("/a = 500", {"a": "5e2"}, True),
    ("/a > 9", {"a": "10"}, True),
    ("/a < 9", {"a": "10"}, False),
    ("/a > '9'", {"a": 10}, True),
    ("/a > '9'", {"a": "10"}, False),  # two strings compare as strings
    ("/a = '10'", {"a": "10.0"}, False),
    ("/a = 5", {"a": " 5"}, False),  # no spaces in a numeric string
    ("/a = 5", {"a": "5 apples"}, False),
    ("/a = 5", {"a": "x"}, False),  # different kinds: not equal ...
    ("/a != 5", {"a": "x"}, True),  # ... and so unequal
    ("/a < 5", {"a": "x"}, False),  # but not ordered: UNKNOWN
    ("/a >= 5", {"a": "x"}, False),
    ("NOT (/a < 5)", {"a": "x"}, False),
    ("/a = 5", {"a": "nan"}, False),
    ("/a = 5", {"a": "inf"}, False),
    ("/a = 5", {"a": ""}, False),
    ("/a != 5", {"a": ""}, True),
    ("/a = 5", {"a": {"b": 5}}, False),  # objects compare as UNKNOWN
    ("/a != 5", {"a": {"b": 5}}, False),
    ("/a = 1", {"a": 1.0}, True),
    ("/a < 1.5", {"a": 1}, True),
    ("/a = 1", {"a": "1" + "0" * 5000}, False),  # more digits than int() takes: still no error
    ("/a > 1", {"a": "1" + "0" * 5000}, True),
]

ARRAYS = [  # a comparison on an array holds if it holds for any element
    ("/tags = 'b'", {"tags": ["a", "b"]}, True),
    ("/tags = 'c'", {"tags": ["a", "b"]}, False),
    ("/tags != 'a'", {"tags": ["a", "b"]}, True),  # 'b' != 'a'
    ("NOT (/tags = 'a')", {"tags": ["a", "b"]}, False),
    ("NOT (/tags = 'c')", {"tags": ["a", "b"]}, True),
    ("/n > 5", {"n": [1, 9]}, True),
    ("/n > 10", {"n": [1, 9]}, False),
    ("/n = 2", {"n": ["2"]}, True),
    ("'b' = /tags", {"tags": ["a", "b"]}, True),
    ("/tags = 'a'", {"tags": []}, False),  # an empty array is NULL
    ("NOT (/tags = 'a')", {"tags": []}, False),
    ("/tags = 'a'", {"tags": [["a"]]}, False),  # no deeper than one level
    ("NOT (/tags = 'a')", {"tags": [["a"]]}, False),
    ("/tags = 'a'", {"tags": [None, "a"]}, True),
    ("NOT (/tags = 'a')", {"tags": [None, "b"]}, False),  # one element UNKNOWN
    ("/a = /b", {"a": [1, 2], "b": [3, 2]}, True),
    ("/a = /b", {"a": [1, 2], "b": [3, 4]}, False),
    ("/tags IN ('x', 'b')", {"tags": ["a", "b"]}, True),
    ("/tags IN ('x', 'y')", {"tags": ["a", "b"]}, False),
    ("/tags NOT IN ('x', 'y')", {"tags": ["a", "b"]}, True),
    ("/tags LIKE '^b'", {"tags": ["a", "bc"]}, True),
    ("/tags LIKE '^z'", {"tags": ["a", "bc"]}, False),
    ("/tags NOT LIKE '^z'", {"tags": ["a", "bc"]}, True),
    ("/tags NOT LIKE '^z'", {"tags": ["a", 5]}, False),  # 5 is UNKNOWN for LIKE
    ("/tags LIKE 'a'", {"tags": []}, False),
    ("/n BETWEEN 5 AND 6", {"n": [1, 5]}, True),
    ("/n BETWEEN 2 AND 3", {"n": [1, 5]}, False),  # no single element is inside
    ("/n NOT BETWEEN 2 AND 3", {"n": [1, 5]}, True),
    ("/n BETWEEN 2 AND 3", {"n": []}, False),
]

IN_CASES = [
    ("/a IN ('x', 'y')", {"a": "y"}, True),
    ("/a IN ('x', 'y')", {"a": "z"}, False),
    ("/a IN ('x')", {"a": "x"}, True),
    ("/a in ('x','y')", {"a": "x"}, True),
    ("/a NOT IN ('x', 'y')", {"a": "z"}, True),
    ("/a NOT IN ('x', 'y')", {"a": "x"}, False),
    ("/a not in ('x', 'y')", {"a": "x"}, False),
    ("/a IN (1, 2, 3)", {"a": 2}, True),
    ("/a IN (1, 2, 3)", {"a": 2.0}, True),
    ("/a IN (1, 2, 3)", {"a": 4}, False),
    ("/a IN (1, 2, 3)", {"a": "2"}, True),  # coercion as for =
    ("/a IN ('1', '2')", {"a": 2}, True),
    ("/a IN ('1', '2')", {"a": "2.0"}, False),
    ("/a IN (1, 'x')", {"a": "x"}, True),
    ("/a IN (1, 'x')", {"a": 1}, True),
    ("/a IN (1, 'x')", {"a": "1"}, True),
    ("/a IN (TRUE)", {"a": True}, True),
    ("/a IN (1)", {"a": True}, False),
    ("/a IN (1, 2)", {}, False),  # NULL IN (...) is UNKNOWN
    ("/a NOT IN (1, 2)", {}, False),
    ("/a IN (1, NULL)", {"a": 1}, True),
    ("/a IN (1, NULL)", {"a": 2}, False),
    ("/a NOT IN (1, NULL)", {"a": 2}, False),  # SQL: never TRUE with a NULL in the list
    ("/a NOT IN (1, NULL)", {"a": 1}, False),
    ("/a IN (/b, /c)", {"a": 3, "b": 1, "c": 3}, True),
    ("/a IN (/b, /c)", {"a": 3, "b": 1, "c": 2}, False),
    ("/a NOT IN (/b, /c)", {"a": 3, "b": 1}, False),  # /c is NULL
    ("/a IN (1 + 1, 3)", {"a": 2}, True),
    ("/a + 1 IN (3)", {"a": 2}, True),
    ("/a IN (-1)", {"a": -1}, True),
    ("(/a = 1) IN (TRUE)", {"a": 1}, True),
]

BETWEEN_CASES = [
    ("/a BETWEEN 1 AND 3", {"a": 1}, True),  # inclusive
    ("/a BETWEEN 1 AND 3", {"a": 3}, True),
    ("/a BETWEEN 1 AND 3", {"a": 2.5}, True),
    ("/a BETWEEN 1 AND 3", {"a": 0}, False),
    ("/a BETWEEN 1 AND 3", {"a": 4}, False),
    ("/a BETWEEN 3 AND 1", {"a": 2}, False),
    ("/a between 1 and 3", {"a": 2}, True),
    ("/a NOT BETWEEN 1 AND 3", {"a": 4}, True),
    ("/a NOT BETWEEN 1 AND 3", {"a": 2}, False),
    ("/a BETWEEN 1 AND 3", {}, False),
    ("/a NOT BETWEEN 1 AND 3", {}, False),
    ("/a BETWEEN 1 AND 3", {"a": "2"}, True),
    ("/a BETWEEN 1 AND 3", {"a": "x"}, False),
    ("/a NOT BETWEEN 1 AND 3", {"a": "x"}, False),
    ("/a BETWEEN 'b' AND 'd'", {"a": "c"}, True),
    ("/a BETWEEN 'b' AND 'd'", {"a": "e"}, False),
    ("/a BETWEEN 'b' AND 'd'", {"a": "10"}, False),  # strings compare as strings
    ("/a BETWEEN 1 AND NULL", {"a": 2}, False),
    ("/a NOT BETWEEN 1 AND NULL", {"a": 2}, False),
    ("/a NOT BETWEEN 5 AND NULL", {"a": 2}, True),  # below the low end is FALSE anyway
    ("/a BETWEEN /lo AND /hi", {"a": 5, "lo": 1, "hi": 9}, True),
    ("/a BETWEEN /lo AND /hi", {"a": 5, "lo": 6, "hi": 9}, False),
    ("/a BETWEEN /lo AND /hi", {"a": 5, "lo": 1}, False),
    ("/a BETWEEN -1 AND 1", {"a": 0}, True),
    ("/a BETWEEN 1 AND 3", {"a": True}, False),
]

LIKE_CASES = [
    ("/s LIKE 'IB'", {"s": "XIBY"}, True),  # search, not full match
    ("/s LIKE '^IB.?$'", {"s": "IBM"}, True),
    ("/s LIKE '^IB.?$'", {"s": "IBMX"}, False),
    ("/s LIKE 'ib'", {"s": "IBM"}, False),  # case-sensitive
    ("/s LIKE '(?i)ib'", {"s": "IBM"}, True),
    ("/s LIKE 'I%'", {"s": "IBM"}, False),  # % is not a wildcard
    ("/s LIKE 'I%'", {"s": "I%"}, True),
    ("/s LIKE '^\\d+$'", {"s": "123"}, True),
    ("/s LIKE '^\\d+$'", {"s": "12a"}, False),
    ("/s LIKE 'it''s'", {"s": "it's"}, True),
    ('/s LIKE "^a|^b"', {"s": "bee"}, True),
    ("/s like 'x'", {"s": "x"}, True),
    ("/s NOT LIKE '^a'", {"s": "ba"}, True),
    ("/s NOT LIKE '^a'", {"s": "ab"}, False),
    ("/s LIKE 'a'", {}, False),
    ("/s NOT LIKE 'a'", {}, False),
    ("/s LIKE '1'", {"s": 1}, False),  # LIKE is for strings
    ("/s NOT LIKE '1'", {"s": 1}, False),
    ("/s LIKE ''", {"s": ""}, True),
    ("/s LIKE 'a' AND /t LIKE 'b'", {"s": "a", "t": "b"}, True),
]

CONSTANTS = [
    ("1=1", {}, True),
    ("1 = 1", None, True),
    ("1=1", [1], True),
    ("1=2", {"a": 1}, False),
    ("1 <> 2", {}, True),
    ("'a' = 'a'", {}, True),
    ("'a' < 'b'", {}, True),
    ("NULL = NULL", {}, False),
    ("NULL IS NULL", {}, True),
    ("NOT (NULL = 1)", {}, False),
    ("1 = 1 OR /a = 1", {}, True),
    ("1 = 2 AND /a = 1", {"a": 1}, False),
    ("1 = 1 AND /a = 1", {"a": 1}, True),
    ("1 = 1 AND /a = 1", {"a": 2}, False),
    ("1 = 2 OR /a = 1", {"a": 1}, True),
    ("(1 = 1) = TRUE", {}, True),
    ("(1 = 2) = FALSE", {}, True),
    ("(NULL = 1) IS NULL", {}, True),
]

NULLS = [  # SQL three-valued logic
    ("/missing = 1", {}, False),
    ("/missing != 1", {}, False),
    ("/missing < 1", {}, False),
    ("/missing > 1", {}, False),
    ("NOT (/missing = 1)", {}, False),
    ("NOT (/missing != 1)", {}, False),
    ("NOT /missing = 1", {}, False),
    ("/missing = 1 OR /a = 1", {"a": 1}, True),  # UNKNOWN OR TRUE = TRUE
    ("NOT (/missing = 1 OR /a = 1)", {"a": 1}, False),
    ("/missing = 1 OR /a = 1", {"a": 2}, False),  # UNKNOWN OR FALSE = UNKNOWN
    ("NOT (/missing = 1 OR /a = 1)", {"a": 2}, False),
    ("/missing = 1 AND /a = 1", {"a": 1}, False),  # UNKNOWN AND TRUE = UNKNOWN
    ("NOT (/missing = 1 AND /a = 1)", {"a": 1}, False),
    ("NOT (/missing = 1 AND /a = 1)", {"a": 2}, True),  # UNKNOWN AND FALSE = FALSE
    ("/a = NULL", {"a": 1}, False),
    ("/a != NULL", {"a": 1}, False),
    ("NOT (/a = NULL)", {"a": 1}, False),
    ("/missing IS NULL", {}, True),
    ("/missing IS NOT NULL", {}, False),
    ("NOT (/missing IS NULL)", {}, False),
    ("NOT /missing IS NOT NULL", {}, True),
    ("/a = /b", {"a": 1}, False),
    ("/a != /b", {"a": 1}, False),
    ("(/missing = 1) IS NULL", {}, True),  # a condition used as a value keeps UNKNOWN
    ("(/a = 1) IS NULL", {"a": 2}, False),
    ("(/missing = 1) = FALSE", {}, False),
    ("(/a = 1) = FALSE", {"a": 2}, True),
    ("(NOT (/missing = 1)) IS NULL", {}, True),
    ("(/missing = 1 OR /a = 1) IS NULL", {"a": 2}, True),
    ("(/missing = 1 OR /a = 1) IS NULL", {"a": 1}, False),
    ("(/missing = 1 AND /a = 1) IS NULL", {"a": 2}, False),
    ("(/missing IN (1)) IS NULL", {}, True),
    ("(/a BETWEEN 1 AND /missing) IS NULL", {"a": 2}, True),
    ("(/missing LIKE 'x') IS NULL", {}, True),
    ("(/missing IS NULL) = TRUE", {}, True),
]

GOLDEN = (
    COMPARISONS
    + BOOLEANS
    + LOGIC
    + PRECEDENCE
    + ARITHMETIC
    + PATHS
    + NON_OBJECT_BODIES
    + COERCION
    + ARRAYS
    + IN_CASES
    + BETWEEN_CASES
    + LIKE_CASES
    + CONSTANTS
    + NULLS
)


@pytest.mark.parametrize(("text", "body", "expected"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden(text, body, expected):
    check(text, body, expected)


def test_division_and_fields_are_told_apart():
    body = {"a": {"b": 6}, "b": 3}
    check("/a/b = 6", body, True)  # a path
    check("/a / /b = 2", {"a": 6, "b": 3}, True)  # division
    check("/a/b / /b = 2", body, True)
    check("/a / 3 = 2", {"a": 6}, True)
    check("/a/3 = 'x'", {"a": {"3": "x"}}, True)  # no spaces: a path step named "3"


def test_predicate_returns_a_real_bool():
    for text, body, _ in GOLDEN:
        assert type(compile_filter(text)(body)) is bool, text


# --------------------------------------------------------------------------------------------
# three-valued logic against a reference evaluator

ATOMS = {  # filter text -> its truth value on BODY_3VL
    "/t = 1": True,
    "/f = 1": False,
    "/u = 1": None,
    "TRUE": True,
    "FALSE": False,
    "NULL = 1": None,
    "/bt": True,  # bare boolean fields
    "/bf": False,
    "/u IN (1, 2)": None,
    "/t IN (2, NULL)": None,
    "/t BETWEEN 0 AND 2": True,
    "/t LIKE 'x'": None,
    "/s LIKE '^y'": True,
    "/t IS NULL": False,
    "/u IS NULL": True,
}
BODY_3VL = {"t": 1, "f": 2, "bt": True, "bf": False, "s": "yes"}


def _not3(a):
    return None if a is None else not a


def _and3(a, b):
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _or3(a, b):
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _random_expression(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        text = rng.choice(list(ATOMS))
        return text, ATOMS[text]
    shape = rng.randrange(8)
    a_text, a = _random_expression(rng, depth - 1)
    if shape == 0:
        return f"NOT ({a_text})", _not3(a)
    if shape == 1:  # a condition as a value, then back
        return f"({a_text}) = TRUE", None if a is None else a is True
    if shape == 2:
        return f"({a_text}) IS NULL", a is None
    if shape == 3:
        return f"({a_text}) IS NOT NULL", a is not None
    if shape == 4:
        return f"({a_text}) IN (FALSE)", None if a is None else a is False
    b_text, b = _random_expression(rng, depth - 1)
    if shape in (5, 6):
        return f"({a_text}) AND ({b_text})", _and3(a, b)
    return f"({a_text}) OR ({b_text})", _or3(a, b)


def test_three_valued_logic_matches_a_reference():
    rng = random.Random(7)
    for _ in range(3000):
        text, expected = _random_expression(rng, 5)
        assert compile_filter(text)(BODY_3VL) is (expected is True), text
        # NOT must see FALSE and UNKNOWN apart
        assert compile_filter(f"NOT ({text})")(BODY_3VL) is (expected is False), text


# --------------------------------------------------------------------------------------------
# malformed text: FilterError naming the position

MALFORMED = [
    # (text, position, words the detail must contain)
    ("", 0, "empty filter"),
    ("   ", 0, "empty filter"),
    ("(", 1, "expected a value after '('"),
    ("()", 1, "empty parentheses"),
    ("(/a = 1", 7, "expected ')' to close '(' at position 0"),
    ("((/a = 1)", 9, "expected ')' to close '(' at position 0"),
    ("(/a = 1 /b", 8, "expected ')'"),
    ("/a = 1)", 6, "unmatched ')'"),
    ("(/a = 1))", 8, "unmatched ')'"),
    (")", 0, "expected a value, found ')'"),
    ("/a =", 4, "expected a value after '=', found end of filter"),
    ("/a = ", 5, "expected a value after '='"),
    ("/a = 1 AND", 10, "expected a value after 'AND'"),
    ("/a = 1 OR", 9, "expected a value after 'OR'"),
    ("/a = 1 AND OR /b = 1", 11, "expected a value after 'AND', found 'OR'"),
    ("AND /a = 1", 0, "expected a value, found 'AND'"),
    ("OR", 0, "expected a value"),
    ("NOT", 3, "expected a value after 'NOT'"),
    ("/a = = 1", 5, "expected a value after '=', found '='"),
    ("/a = 1 +", 8, "expected a value after '+'"),
    ("* /a", 0, "expected a value, found '*'"),
    ("/a = 1 * * 2", 9, "expected a value after '*'"),
    ("/a = 'abc", 5, "unterminated string"),
    ('/a = "abc', 5, "unterminated string"),
    ("/a = 'it''s", 5, "unterminated string"),
    ("/a = 'x' AND /b = 'y", 18, "unterminated string"),
    ("'", 0, "unterminated string"),
    ("/a = foo", 5, "unknown word 'foo'"),
    ("foo = 1", 0, "unknown word 'foo'"),
    ("/a = 1 ANDX /b = 1", 7, "unknown word 'ANDX'"),
    ("/a = upper(/b)", 5, "unsupported function 'upper'"),
    ("/a & 1", 3, "unexpected character '&'"),
    ("/a = 1;", 6, "unexpected character ';'"),
    ("/a = #", 5, "unexpected character '#'"),
    ("/a ! 1", 3, "unexpected character '!'"),
    ("/a = 1 && /b = 2", 7, "unexpected character '&'"),
    ("/a = [1]", 5, "unexpected character '['"),
    ("/a = 1 = 2", 7, "comparisons cannot be chained"),
    ("1 < /a < 3", 7, "comparisons cannot be chained"),
    ("/a IS NULL = TRUE", 11, "comparisons cannot be chained"),
    ("/a BETWEEN 1 AND 2 BETWEEN 3 AND 4", 19, "comparisons cannot be chained"),
    ("/a = 1 /b = 2", 7, "unexpected field '/b' after a complete expression"),
    ("10/x = 1", 2, "put spaces around '/' for division"),
    ("/a 1", 3, "unexpected number '1'"),
    ("/a 'x'", 3, "unexpected string 'x'"),
    ("/a = 1 TRUE", 7, "unexpected 'TRUE'"),
    ("/", 1, "expected a field name after '/'"),
    ("/ a", 1, "expected a field name after '/'"),
    ("/a = /", 6, "expected a field name after '/'"),
    ("/a = / 2", 6, "expected a field name after '/'"),
    ("/a[", 3, "expected an array index"),
    ("/a[x] = 1", 3, "expected an array index"),
    ("/a[-1] = 1", 3, "expected an array index"),
    ("/a[1 = 1", 4, "expected ']'"),
    ("/a[12345678901] = 1", 3, "array index too large"),
    ("1abc = 1", 0, "malformed number '1abc'"),
    ("/a = 1.2.3", 5, "malformed number"),
    ("/a = 1e", 5, "malformed number '1e'"),
    ("/a = 1AND /b = 1", 5, "malformed number"),
    ("/a = " + "9" * 5000, 5, "number has too many digits"),
    ("/a IN 1", 6, "expected '(' after IN, found number '1'"),
    ("/a IN", 5, "expected '(' after IN, found end of filter"),
    ("/a IN ()", 7, "IN needs at least one value"),
    ("/a IN (1, 2", 11, "expected ',' or ')' in the IN list opened at position 6"),
    ("/a IN (1 2)", 9, "expected ',' or ')'"),
    ("/a IN (1,)", 9, "expected a value after ','"),
    ("/a IN (,1)", 7, "expected a value after '('"),
    ("/a IN (1 = 1)", 9, "expected ',' or ')'"),
    ("/a BETWEEN 1", 12, "expected AND in BETWEEN, found end of filter"),
    ("/a BETWEEN 1 OR 2", 13, "expected AND in BETWEEN, found 'OR'"),
    ("/a BETWEEN AND 2", 11, "expected a value after 'BETWEEN'"),
    ("/a BETWEEN 1 AND", 16, "expected a value after 'AND'"),
    ("/a IS 5", 6, "expected NULL or NOT NULL after IS"),
    ("/a IS NOT 5", 10, "expected NULL after IS"),
    ("/a IS", 5, "expected NULL or NOT NULL"),
    ("/a NOT 5", 7, "expected IN, BETWEEN or LIKE after NOT"),
    ("/a NOT NULL", 7, "expected IN, BETWEEN or LIKE after NOT"),
    ("/a = 1 NOT /b = 1", 7, "comparisons cannot be chained"),
    ("/a NOT /b = 1", 7, "expected IN, BETWEEN or LIKE after NOT, found field '/b'"),
    ("/a LIKE /b", 8, "LIKE needs a quoted regular expression, found field '/b'"),
    ("/a LIKE 5", 8, "LIKE needs a quoted regular expression"),
    ("/a LIKE", 7, "LIKE needs a quoted regular expression, found end of filter"),
    ("/a LIKE '('", 8, "bad regular expression in LIKE"),
    ("/a LIKE 'ab['", 8, "bad regular expression in LIKE"),
    (
        "/a LIKE 'x''y('",
        8,
        "bad regular expression in LIKE",
    ),  # the position of the pattern (RE2 gives none inside it)
    ("/a LIKE 'a**'", 8, "bad regular expression in LIKE: bad repetition operator"),
    ("/a LIKE '\\'", 8, "bad regular expression in LIKE"),
    (
        "/a LIKE '(a)\\1'",
        8,
        "bad regular expression in LIKE: invalid escape sequence",
    ),  # no backreferences
    (
        "/a LIKE '(?=a)'",
        8,
        "bad regular expression in LIKE: invalid perl operator",
    ),  # no lookaround
    ("/a = 1 OR /b LIKE '*'", 18, "bad regular expression in LIKE"),
    # non-ASCII digits: str.isdigit() says yes, no number or index is made of them
    ("/a = \u00b2", 5, "unexpected character"),
    ("/a = 1\u00b2", 5, "malformed number"),
    ("/a[\u00b2] = 1", 3, "expected an array index"),
    ("/a[1\u0663] = 1", 4, "expected ']'"),
]


@pytest.mark.parametrize(
    ("text", "position", "detail"), MALFORMED, ids=[m[0][:40] for m in MALFORMED]
)
def test_malformed(text, position, detail):
    with pytest.raises(FilterError) as info:
        compile_filter(text)
    e = info.value
    assert e.position == position, f"{text!r}: {e}"
    assert detail in e.detail, f"{text!r}: {e}"
    assert e.text == text
    assert str(e).startswith(f"bad filter at position {position}: ")


def test_filter_error_shape():
    with pytest.raises(FilterError) as info:
        compile_filter("/a = ")
    e = info.value
    assert isinstance(e, ValueError)
    assert e.reason == FilterError.reason == "bad filter"
    assert (e.text, e.position) == ("/a = ", 5)
    assert e.detail == "expected a value after '=', found end of filter"
    assert str(e) == (
        "bad filter at position 5: expected a value after '=', found end of filter (in \"/a = \")"
    )
    copy = pickle.loads(pickle.dumps(e))
    assert (type(copy), copy.text, copy.position, copy.detail, str(copy)) == (
        FilterError,
        e.text,
        e.position,
        e.detail,
        str(e),
    )


def test_filter_error_message_stays_short_and_printable():
    text = "/a = 1 AND " * 5000 + "/b = \n"
    with pytest.raises(FilterError) as info:
        compile_filter(text)
    assert info.value.position == len(text)
    message = str(info.value)
    assert len(message) < 300
    assert "\n" not in message
    assert message.endswith('/b =  ")')


def test_non_string_filter_is_a_filter_error():
    for value in (None, b"/a = 1", 5, ["/a = 1"]):
        with pytest.raises(FilterError) as info:
            compile_filter(value)
        assert info.value.position == 0
        assert "filter must be a string" in info.value.detail
    with pytest.raises(FilterError):
        compile_body_filter(None)


# --------------------------------------------------------------------------------------------
# limits: hostile text is a FilterError, never a crash


def test_text_length_limit():
    unit = "/a = 1 OR "
    ok = unit * ((MAX_FILTER_TEXT - 6) // len(unit)) + "/a = 2"
    assert len(ok) <= MAX_FILTER_TEXT
    assert compile_filter(ok)({"a": 2}) is True
    too_long = ok + " " * (MAX_FILTER_TEXT + 1 - len(ok))
    assert len(too_long) == MAX_FILTER_TEXT + 1
    with pytest.raises(FilterError) as info:
        compile_filter(too_long)
    assert info.value.position == MAX_FILTER_TEXT
    assert "the limit is 65536" in info.value.detail


def _nested(kind, n):
    """A filter whose nesting is ``n`` levels of ``kind``, TRUE on {"a": 1}."""
    if kind == "parens":
        return "(" * n + "/a = 1" + ")" * n
    if kind == "not":
        return "NOT " * (2 * (n // 2)) + "/a = 1" if n % 2 == 0 else "NOT " * n + "/a = 2"
    if kind == "minus":
        return "-" * (2 * (n // 2)) + "/a = 1" if n % 2 == 0 else "-" * n + "/a = -1"
    if kind == "and":
        return "(/a = 1 AND " * n + "TRUE" + ")" * n
    if kind == "or":
        return "(/a = 2 OR " * n + "/a = 1" + ")" * n
    if kind == "value":  # conditions used as values, each one level deeper
        return "(" * n + "/a = 1" + ") = TRUE" * n
    if kind == "between":  # /a BETWEEN 0 AND TRUE is UNKNOWN
        return "(" + "/a BETWEEN 0 AND (" * (n - 1) + "1" + ")" * (n - 1) + ") IS NULL"
    if kind == "in":  # each IN list is a level, and so is the parenthesis inside it
        k = (n - 2) // 2
        return "(" + "/a IN ((" * k + "(1)" + "))" * k + ") IS NOT NULL"
    if kind == "arith":
        return "(/a * " * n + "1" + ")" * n + " = 1"
    raise AssertionError(kind)


NEST_KINDS = ["parens", "not", "minus", "and", "or", "value", "between", "in", "arith"]


def _call_with_stack_in_use(frames, fn):
    """Call fn() with ``frames`` more frames on the stack, as a server's callers would have."""
    if frames == 0:
        return fn()
    return _call_with_stack_in_use(frames - 1, fn)


@pytest.mark.parametrize("kind", NEST_KINDS)
def test_nesting_at_the_limit_compiles_and_evaluates(kind):
    text = _nested(kind, MAX_FILTER_DEPTH)

    def run():
        return compile_filter(text)({"a": 1})

    compile_filter.cache_clear()  # compile under the extra frames, not from the cache
    assert _call_with_stack_in_use(100, run) is True


@pytest.mark.parametrize("kind", ["parens", "not", "minus", "and", "or", "value", "between"])
def test_nesting_over_the_limit_fails_where_it_goes_over(kind):
    text = _nested(kind, MAX_FILTER_DEPTH + 1)
    with pytest.raises(FilterError) as info:
        compile_filter(text)
    assert f"nesting deeper than {MAX_FILTER_DEPTH} levels" in info.value.detail
    opener = {
        "parens": "(",
        "not": "NOT",
        "minus": "-",
        "and": "(",
        "or": "(",
        "value": "(",
        "between": "(",
    }[kind]
    # the offending token is the (MAX_FILTER_DEPTH + 1)-th opener
    position = -1
    for _ in range(MAX_FILTER_DEPTH + 1):
        position = text.index(opener, position + 1)
    assert info.value.position == position


def test_huge_nesting_is_a_filter_error():
    for text in (
        "(" * 60_000,
        "NOT " * 16_000 + "TRUE",
        "-" * 60_000 + "1 = 1",
        "/a IN ((" * 8000,
        "(" * 30000 + "1=1" + ")" * 30000,
    ):
        with pytest.raises(FilterError) as info:
            compile_filter(text)
        assert "nesting deeper than" in info.value.detail


def test_long_flat_chains_do_not_recurse():
    many_or = " OR ".join(f"/a = {i}" for i in range(5000))
    assert compile_filter(many_or)({"a": 4999}) is True
    assert compile_filter(many_or)({"a": 5000}) is False
    assert compile_filter(f"NOT ({many_or})")({"a": 5000}) is True
    many_and = " AND ".join(f"/a != {i}" for i in range(4000))
    assert compile_filter(many_and)({"a": 4000}) is True
    assert compile_filter(many_and)({"a": 3999}) is False
    sum_chain = " + ".join(["/a"] * 5000) + " = 5000"
    assert compile_filter(sum_chain)({"a": 1}) is True
    product_chain = " * ".join(["/a"] * 5000) + " = 1"
    assert compile_filter(product_chain)({"a": 1}) is True
    in_list = "/a IN (" + ", ".join(str(i) for i in range(8000)) + ")"
    assert compile_filter(in_list)({"a": 7999}) is True


def test_growing_numbers_stay_bounded():
    # 3000 multiplications of a 300-digit number would build a 900,000-digit integer
    text = " * ".join(["/a"] * 3000) + " > 0"
    start = time.perf_counter()
    assert compile_filter(text)({"a": 10**300}) is False  # beyond the float range: NULL
    assert compile_filter(text)({"a": "1" + "0" * 300}) is False
    assert time.perf_counter() - start < 1.0


def test_deep_conditions_as_values_evaluate_in_linear_time():
    # each level evaluates its subtree once: evaluating it twice (TRUE? then FALSE?) would cost
    # 2**22 evaluations here, seconds per message
    text = "(" * 22 + "/a = 2" + ") = TRUE" * 22
    start = time.perf_counter()
    assert compile_filter(text)({"a": 1}) is False
    assert compile_filter(f"NOT ({text})")({"a": 1}) is True
    between = "/a BETWEEN 0 AND (" * 22 + "1" + ")" * 22
    assert compile_filter(between)({"a": 1}) is False
    assert time.perf_counter() - start < 1.0


# --------------------------------------------------------------------------------------------
# evaluation never raises

WEIRD_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    2**70,
    -(10**400),
    1.5,
    float("inf"),
    float("-inf"),
    float("nan"),
    "",
    "x",
    "5",
    "-5.5e3",
    "1" + "0" * 5000,
    [],
    [1, "a", None],
    [[1]],
    {},
    {"a": 1},
    ("tuple",),
    object(),
    b"bytes",
]

EVERY_OPERATOR = [
    "/a = 1",
    "/a = 'x'",
    "/a != 1",
    "/a < 'x'",
    "/a <= 1",
    "/a > 1.5",
    "/a >= /b",
    "/a = TRUE",
    "/a",
    "NOT /a",
    "/a IN (1, 'x', NULL)",
    "/a IN ('x', 'y')",
    "/a NOT IN (1, 2)",
    "/a IN (/b, 1)",
    "/a BETWEEN 1 AND 2",
    "/a NOT BETWEEN 'a' AND 'b'",
    "/a BETWEEN /b AND 3",
    "/a LIKE 'x'",
    "/a NOT LIKE '^$'",
    "/a IS NULL",
    "/a IS NOT NULL",
    "/a + /b > 0",
    "/a - 1 < 0",
    "/a * /b = 0",
    "/a / /b = 1",
    "/a % /b = 0",
    "-/a = 1",
    "+/a = 1",
    "(/a = /b) IS NULL",
    "(/a > 1) = /b",
    "/a/b = 1",
    "/a[0] = 1",
    "/a[0][0] = 1",
    "/a/b[1]/c IS NULL",
    "NOT (/a = 1 OR /b = 2) AND /a IS NOT NULL",
]


def test_evaluation_never_raises():
    rng = random.Random(11)
    predicates = [compile_filter(text) for text in EVERY_OPERATOR]
    bodies = [*WEIRD_VALUES]
    for a in WEIRD_VALUES:
        bodies.append({"a": a, "b": rng.choice(WEIRD_VALUES)})
        bodies.append({"a": [a], "b": {"a": a}})
        bodies.append({"a": {"b": [a, a, {"c": a}]}})
    for body in bodies:
        for text, predicate in zip(EVERY_OPERATOR, predicates, strict=True):
            assert type(predicate(body)) is bool, (text, body)


FUZZ_TOKENS = [
    "/a",
    "/b",
    "/a/b",
    "/a[0]",
    "1",
    "0",
    "2.5",
    "'x'",
    '"y"',
    "''",
    "TRUE",
    "FALSE",
    "NULL",
    "=",
    "!=",
    "<>",
    "<",
    "<=",
    ">",
    ">=",
    "+",
    "-",
    "*",
    " / ",
    "%",
    "MOD",
    "(",
    ")",
    ",",
    "AND",
    "OR",
    "NOT",
    "IN",
    "BETWEEN",
    "LIKE",
    "IS",
    "'^a'",
    "'('",
    "/",
    "[",
    "]",
    "'",
    "&",
    "x",
]


def test_random_text_compiles_or_fails_with_filter_error():
    rng = random.Random(5)
    bodies = [{}, {"a": 1, "b": "x"}, {"a": [0, "a"], "b": {"b": None}}, {"a": {"b": 2}}, [1], None]
    compiled = 0
    for _ in range(20000):
        text = " ".join(rng.choice(FUZZ_TOKENS) for _ in range(rng.randint(1, 12)))
        try:
            predicate = compile_filter(text)
        except FilterError as e:
            assert 0 <= e.position <= len(text), (text, e.position)
            assert e.reason == "bad filter"
            continue
        compiled += 1
        for body in bodies:
            assert type(predicate(body)) is bool, (text, body)
    assert compiled > 500  # the fuzz reaches valid filters too


# --------------------------------------------------------------------------------------------
# caching, raw bodies, speed


def test_compiled_filters_are_cached_and_shared():
    text = "/cache_me = 'x'"
    assert compile_filter(text) is compile_filter(text)
    assert compile_filter.cache_info().hits >= 1
    long_text = " OR ".join(f"/a = {i}" for i in range(1000))  # large texts are cached too
    assert len(long_text) > 4096
    assert compile_filter(long_text)({"a": 999}) is True
    assert compile_filter(long_text) is compile_filter(long_text)
    assert compile_body_filter(text) is compile_body_filter(text)


def test_the_compile_cache_is_bounded_in_text_and_answers_cheaply(monkeypatch):
    from protocol.filters import CHEAP_TEXT, api, cached_filter

    assert api._CACHE.chars == api.CACHE_TEXT  # the server's cache has the documented budget
    # the same cache with a tenth of the budget: filling 2 MiB of 2,000-term filters took a
    # minute of the suite on two busy cores; the eviction rule does not depend on the size
    monkeypatch.setattr(api._CACHE, "chars", api.CACHE_TEXT // 10)
    CACHE_TEXT = api._CACHE.chars

    compile_filter.cache_clear()
    big = [" OR ".join(f"/a{n} = {i}" for i in range(2000)) for n in range(3)]
    assert all(len(t) > CHEAP_TEXT for t in big)
    assert cached_filter(big[0]) is None  # long and not compiled yet: the caller may defer it
    first = compile_filter(big[0])
    assert cached_filter(big[0]) is first
    assert cached_filter("/short = 1") is compile_filter("/short = 1")  # short: compiled now
    with pytest.raises(FilterError):
        cached_filter("/short =")
    # fill the cache past its text budget: the least recently used go, the size stays bounded
    many = CACHE_TEXT // len(big[1]) + 5
    for n in range(many):
        compile_filter(big[1] + f" OR /z = {n}")
    info = compile_filter.cache_info()
    assert info.chars <= CACHE_TEXT
    assert cached_filter(big[0]) is None


def test_compile_body_filter():
    predicate = compile_body_filter("/a = 'x' AND /n > 1")
    assert predicate(b'{"a": "x", "n": 2}') is True
    assert predicate(b'{"a": "x", "n": 1}') is False
    assert predicate(memoryview(b'{"a": "x", "n": 2}')) is True
    assert predicate(b'{"a": "x", "n": ') is False  # not JSON
    assert predicate(b"") is False
    assert predicate(b"\xff\xfe") is False
    assert predicate(b"[1, 2]") is False
    assert predicate(b"[" * 100_000) is False  # nesting msgspec refuses
    assert predicate(None) is False
    everything = compile_body_filter("1=1")
    assert everything(b"not json at all") is True  # 1=1 matches every message
    assert everything(b"") is True
    assert compile_body_filter("1=2")(b'{"a": 1}') is False
    assert compile_body_filter("/a IS NULL")(b"not json") is False
    with pytest.raises(FilterError):
        compile_body_filter("/a = ")


def test_simple_filter_is_fast():
    predicate = compile_filter("/a = 'x'")
    body = {"a": "x", "b": 1, "c": [1, 2, 3], "d": {"e": "f"}}
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20000):
            predicate(body)
        runs.append((time.perf_counter() - start) / 20000)
    # well under 1 µs on a workstation; the bound is loose so a busy CI box does not fail it
    assert min(runs) < 2e-6, f"{min(runs) * 1e9:.0f} ns per call"


def test_recursion_limit_untouched():
    before = sys.getrecursionlimit()
    compile_filter.cache_clear()
    compile_filter(_nested("and", MAX_FILTER_DEPTH))
    assert sys.getrecursionlimit() == before
