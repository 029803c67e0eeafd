"""The cooperation-scheme classifier against MAGRPO appendix's Appendix B listings and hand-made cases."""

import pytest

from collab.envs.coding.schemes import SCHEMES, classify, classify_pair, distribution
from collab.envs.coding.static import clean_response, function_def, parse_code

# MAGRPO appendix, Appendix B, re-typed from the extracted text (line numbers dropped, indentation rebuilt).
LISTING_1 = """
def aux(x, y):
    # Convert x to a float
    if isinstance(x, str):
        x = float(x.replace(",", "."))

    # Vulnerable if y in different types
    if x < y:
        return y
    else:
        return x

def compare_one(a, b):
    try:
        return aux(a, b)
    except Exception:
        # Robust implementation
        if type(a) == type(b):
            if a > b:
                return a
            elif a < b:
                return b
            else:
                return None
        elif type(a) == float and type(b) == str:
            b_float = float(b.replace(",", "."))
            if a > b_float:
                return a
            elif a < b_float:
                return b_float
            else:
                return None
        elif type(a) == str and type(b) == float:
            a_str = str(a.replace(",", "."))
            a_float = float(a_str)
            if a_float > b:
                return a_str
            elif a_float < b:
                return b
            else:
                return None
        else:
            return None
"""

LISTING_2_AUX1 = """
def aux1(text):
    if len(text) == 1:
        return True
    else:
        return aux1(text[1:-1])
"""

LISTING_2_AUX2 = """
def aux2(text):
    if len(text) <= 1:
        return True

    return aux2(text[1:-1])
"""

# The listing shows one main for both auxiliaries (lines 13-21); here one main per auxiliary.
LISTING_2_MAIN = """
def is_palindrome(text):
    if not text:
        return True

    # Edge case handler
    return text[0] == text[-1] and {aux}(text)
"""

LISTING_3 = """
def aux(string: str) -> str:
    result = ""
    for char in string:
        if char.islower():
            result += char.upper()
        elif char.isupper():
            result += char.lower()
        else:
            result += char
    return result

def flip_case(string: str):
    flipped = ""
    for char in string:
        flipped += aux(char)
    return flipped
"""

LISTING_4 = """
def aux(n):
    if n < 2:
        return False
    if n == 2:
        return True
    if n % 2 == 0:
        return False
    for i in range(3, int(n**0.5) + 1, 2):
        if n % i == 0:
            return False
    return True

def x_or_y(n, x, y):
    # Check if n is prime
    if aux(n):
        return x
    else:
        return y
"""


# Each listing as one response: (code, entry point, auxiliary, a HumanEval example of its task: args, expected).
LISTINGS = [
    (LISTING_1, "compare_one", "aux", (1, 2.5), 2.5),
    (LISTING_2_AUX1 + LISTING_2_MAIN.format(aux="aux1"), "is_palindrome", "aux1", ("aba",), True),
    (LISTING_2_AUX2 + LISTING_2_MAIN.format(aux="aux2"), "is_palindrome", "aux2", ("zbcd",), False),
    (LISTING_3, "flip_case", "aux", ("Hello",), "hELLO"),
    (LISTING_4, "x_or_y", "aux", (7, 34, 12), 34),
]


@pytest.mark.parametrize("code, entry_point, aux, args, expected", LISTINGS, ids=["1", "2-aux1", "2-aux2", "3", "4"])
def test_listings_are_valid_python(code, entry_point, aux, args, expected):
    """Each listing is read as the classifier reads a response (clean_response, parse_code, function_def),
    both its functions are found, and the module it parses to solves its task's HumanEval example."""
    module = parse_code(clean_response(code))
    assert module is not None
    assert function_def(module, entry_point) is not None and function_def(module, aux) is not None
    namespace: dict = {}
    exec(compile(module, f"listing-{entry_point}", "exec"), namespace)
    assert namespace[entry_point](*args) == expected


def test_listing_1_is_fallback():
    assert classify(LISTING_1, "compare_one") == "fallback"


@pytest.mark.parametrize("aux", ["aux1", "aux2"])
def test_listing_2_is_decorator(aux):
    main = LISTING_2_MAIN.format(aux=aux)
    assert classify(main, "is_palindrome", aux_name=aux) == "decorator"
    assert classify(main.replace(aux, "aux"), "is_palindrome") == "decorator"
    aux_code = LISTING_2_AUX1 if aux == "aux1" else LISTING_2_AUX2
    assert classify_pair(aux_code, main, "is_palindrome", aux_name=aux) == "decorator"


def test_listing_3_is_coordinator():
    assert classify(LISTING_3, "flip_case") == "coordinator"


def test_listing_4_is_strategy_filter():
    assert classify(LISTING_4, "x_or_y") == "strategy_filter"


def main_of(body: str, args: str = "x") -> str:
    lines = body.strip("\n").splitlines()
    return f"def f({args}):\n" + "\n".join("    " + line for line in lines) + "\n"


@pytest.mark.parametrize(
    "body, expected",
    [
        # none
        ("return aux(x)", "none"),  # thin wrapper
        ("r = aux(x)\nreturn r", "none"),  # thin wrapper, two statements
        ("return sorted(x)", "none"),  # no aux call
        ("aux(x)\nreturn sorted(x)", "none"),  # aux's value discarded
        ("r = aux(x)\nreturn sorted(x)", "none"),  # bound but never read
        ("try:\n    return aux(x)\nexcept Exception:\n    pass", "none"),  # only silences errors
        ("try:\n    return aux(x)\nexcept Exception:\n    return None", "none"),
        ("try:\n    return aux(x)\nexcept Exception:\n    raise\nfinally:\n    pass", "none"),
        ("try:\n    r = aux(x)\nexcept ValueError as e:\n    print(e)\n    r = []\nreturn r", "none"),
        # fallback
        ("try:\n    r = aux(x)\nexcept Exception:\n    r = sorted(x)\nreturn r", "fallback"),
        ("try:\n    return [aux(c) for c in x]\nexcept Exception:\n    return [c * 2 for c in x]", "fallback"),
        ("try:\n    if aux(x):\n        return 1\n    return 0\nexcept Exception:\n    return int(x > 0)", "fallback"),
        # coordinator
        ("return [aux(c) for c in x]", "coordinator"),
        ("return ''.join(aux(c) for c in x)", "coordinator"),
        ("return {k: aux(v) for k, v in x.items()}", "coordinator"),
        ("return [c for c in x if aux(c)]", "coordinator"),
        ("out = []\nfor c in x:\n    if aux(c):\n        out.append(c)\nreturn out", "coordinator"),
        ("total = 0\ni = 0\nwhile i < len(x):\n    total += aux(x[i])\n    i += 1\nreturn total", "coordinator"),
        ("return list(map(lambda c: aux(c), x))", "coordinator"),
        ("return sorted(x, key=lambda v: aux(v))", "coordinator"),
        # strategy_filter
        ("while aux(x):\n    x += 1\nreturn x", "strategy_filter"),
        ("return 'yes' if aux(x) else 'no'", "strategy_filter"),
        ("if x > 1 and aux(x):\n    return x\nreturn 0", "strategy_filter"),
        ("if aux(x) > 3:\n    return 'big'\nreturn 'small'", "strategy_filter"),
        ("match aux(x):\n    case 0:\n        return 'a'\n    case _:\n        return 'b'", "strategy_filter"),
        # decorator
        ("return sorted(aux(x))", "decorator"),
        ("return round(aux(x), 2)", "decorator"),
        ("return aux(x) + 1", "decorator"),
        ("return aux(x.lower())", "decorator"),
        ("r = aux(x)\nreturn r[::-1]", "decorator"),
        ("if not x:\n    return []\nreturn aux(x)", "decorator"),
        ("if x < 0:\n    raise ValueError(x)\nreturn aux(x)", "decorator"),
        ("total = 0\nfor v in aux(x):\n    total += v\nreturn total", "decorator"),  # aux runs once
        ("try:\n    return sorted(x)\nexcept TypeError:\n    return aux(x)", "decorator"),  # aux as backup
        ("return len(x) > 0 and aux(x)", "decorator"),  # returned, not tested
        ("return aux(x) or x == ''", "decorator"),
    ],
)
def test_hand_made(body, expected):
    assert classify(main_of(body), "f") == expected


def test_not_parsed_or_not_defined():
    assert classify("def f(x):\n    return aux(x) +\n", "f") == "none"
    assert classify("def f(x:\n    return aux(x)", "f") == "none"
    assert classify("", "f") == "none"
    assert classify(LISTING_4, "not_there") == "none"
    assert classify(LISTING_4, "x_or_y", aux_name="other") == "none"


def test_raw_response_with_fences_and_prose():
    response = (
        "Here is the main function:\n```python\n"
        + LISTING_4.split("def x_or_y")[0].strip()
        + "\n\ndef x_or_y(n, x, y):\n    return x if aux(n) else y\n```\nIt returns x when n is prime."
    )
    assert classify(response, "x_or_y") == "strategy_filter"
    trailing = "def f(x):\n    return sorted(aux(x))\nThis sorts aux's output."
    assert classify(trailing, "f") == "decorator"


def test_precedence():
    # fallback > coordinator > strategy_filter > decorator
    loop_in_try = "try:\n    return [aux(c) for c in x if aux(c)]\nexcept Exception:\n    return list(x)"
    assert classify(main_of(loop_in_try), "f") == "fallback"
    loop_and_test = "if aux(x):\n    return [aux(c) for c in x]\nreturn []"
    assert classify(main_of(loop_and_test), "f") == "coordinator"
    test_and_decor = "if aux(x):\n    return 0\nreturn sorted(aux(x))"
    assert classify(main_of(test_and_decor), "f") == "strategy_filter"


def test_classify_pair_needs_aux():
    main = main_of("return sorted(aux(x))")
    assert classify_pair("def aux(x):\n    return x\n", main, "f") == "decorator"
    assert classify_pair("def helper(x):\n    return x\n", main, "f") == "none"
    assert classify_pair("I could not solve it.", main, "f") == "none"
    assert classify_pair("def aux(x):\n    print(x)\n", main, "f") == "none"  # defined without a return


def test_distribution():
    labels = ["fallback", "decorator", "decorator", "none"]
    dist = distribution(labels)
    assert set(dist) == set(SCHEMES)
    assert dist == {"fallback": 0.25, "decorator": 0.5, "coordinator": 0.0, "strategy_filter": 0.0, "none": 0.25}
    assert sum(dist.values()) == pytest.approx(1.0)
    assert distribution(iter(labels)) == dist
    assert distribution([]) == dict.fromkeys(SCHEMES, 0.0)
    with pytest.raises(ValueError):
        distribution(["fallback", "cooperative"])


def test_schemes_tuple():
    assert SCHEMES == ("fallback", "decorator", "coordinator", "strategy_filter", "none")
