"""Final-answer extraction and equivalence of the math environment (collab.envs.math.answers)."""

import pytest

from collab.envs.math.answers import extract_answer, fallback_answer, is_equiv, last_boxed, normalize

EQUAL = [
    ("1,000", "1000"),
    ("0.5", "1/2"),
    ("0.5", r"\frac{1}{2}"),
    (r"\dfrac12", "1/2"),
    (r"\tfrac{1}{2}", "0.5"),
    (r"\frac12", r"\frac{1}{2}"),
    ("2.0", "2"),
    ("-3", "- 3"),
    (".5", "1/2"),
    (r"-\frac{1}{2}", "-0.5"),
    (r"\frac{-1}{2}", "-1/2"),
    (r"2\frac{1}{2}", "5/2"),
    ("079", "79"),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    (r"5\text{ cm}", "5"),
    (r"\frac{68}{3}\text{ pounds}", "68/3"),
    (r"\$18", "18"),
    ("$18.00", "18"),
    (r"\$1,234.50", "1234.5"),
    (r"\$15,\!000", "15000"),
    (r"10{,}000", "10000"),
    (r"50\%", "50"),
    ("50%", "50"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"1\,000", "1000"),
    ("x = 5", "5"),
    ("16 - 3 - 4 = 9", "9"),
    (r"x \in [-2,7]", "[-2, 7]"),
    ("5.", "5"),
    ("18 dollars", "18"),
    ("12 inches^2", "12"),
    ("(1,2)", "(1, 2)"),
    ("[1, 2)", r"\left[1,2\right)"),
    ("1, 2", "2, 1"),
    (r"\sqrt{2}", r"\sqrt2"),
    (r"3\sqrt{2}", r"3 \sqrt 2"),
    (r"\frac{\sqrt{3}}{2}", r"\dfrac{\sqrt3}2"),
    (r"\sqrt[3]{8}", r"\sqrt[3]8"),
    (r"\text{(A)}", "A"),
    ("Yes", "yes"),
    ("y = 2x+3", "2x + 3"),
    (r"\boxed{7}", "7"),
    ("\u22124", "-4"),
]

UNEQUAL = [
    ("1/2", "2"),
    ("0.33", "1/3"),
    ("0.333", r"\frac{1}{3}"),
    ("12", "120"),
    ("(1,2)", "(2,1)"),
    ("[1,2]", "(1,2)"),
    ("1, 2", "1, 2, 3"),
    ("2^3", "8"),
    ("0.5", "50"),
    ("1", "-1"),
    ("x", "y"),
    ("5 and 6", "5"),
    ("2 pi", "2"),
    (r"\sqrt{2}", r"\sqrt{3}"),
    (None, "1"),
    ("", "0"),
]


@pytest.mark.parametrize("pred, gold", EQUAL)
def test_equal_forms(pred, gold):
    assert is_equiv(pred, gold)
    assert is_equiv(gold, pred)
    assert normalize(pred) == normalize(gold)


@pytest.mark.parametrize("pred, gold", UNEQUAL)
def test_unequal_forms(pred, gold):
    assert not is_equiv(pred, gold)


def test_float_noise_only():
    assert is_equiv("0.30000000000000004", "0.3")  # relative difference 1e-16: float noise
    assert not is_equiv("0.3333", "1/3")  # rounding is not accepted
    assert normalize("0.30000000000000004") != normalize("0.3")  # normalize is exact


def test_normalize_canonical_strings():
    assert normalize(r"\dfrac{2}{4}") == "1/2"
    assert normalize("$1,000.00") == "1000"
    assert normalize(r"\left( -1, \frac{3}{2} \right)") == "(-1,3/2)"
    assert normalize("3, 1, 2") == "1,2,3"  # an unordered list of solutions
    assert normalize(r"\text{Evelyn}") == "evelyn"


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"so x = \boxed{\frac{1}{2}} and we are done", r"\frac{1}{2}"),
        (r"first \boxed{3}, then \boxed{4}", "4"),
        (r"\boxed{\left(1, \{2\}\right)}", r"\left(1, \{2\}\right)"),
        (r"The total is $\boxed 5$.", "5"),
        (r"\fbox{7}", "7"),
        ("Provide final answer within boxed{18}", "18"),
        (r"\boxed{1} and a truncated \boxed{2", "1"),
    ],
)
def test_boxed_extraction(text, answer):
    assert last_boxed(text) == answer
    assert extract_answer(text) == answer
    assert extract_answer(text, fallback=False) == answer


@pytest.mark.parametrize(
    "text, answer",
    [
        ("She makes 9 * 2 = 18 dollars. The answer is $18.", "18"),
        ("Answer: 42 apples", "42 apples"),
        ("The final answer is: **7**", "7"),
        ("16 - 3 - 4 = 9 eggs\n#### 1,000", "1,000"),
        ("we get 16-3 so 13 are left", "13"),
        ("the total is 16-3", "3"),
        ("half of it is 1/2", "1/2"),
    ],
)
def test_fallback_extraction(text, answer):
    assert last_boxed(text) is None
    assert fallback_answer(text) == answer
    assert extract_answer(text) == answer
    assert extract_answer(text, fallback=False) is None


def test_nothing_to_extract():
    assert extract_answer("I do not know.") is None
    assert extract_answer("") is None
    assert is_equiv(extract_answer("The answer is 18 dollars."), "18")
