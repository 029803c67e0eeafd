r"""Dr. MAS's DeepScaleR grader (:mod:`collab.envs.math.deepscaler`) against the reference's own verdicts, and the
math env's ``grader`` option.

Every verdict of ``CASES`` is what the reference (``langfengQ/DrMAS`` at 19c632b, ``RewardMathFn`` of
``agent_system/environments/env_package/math/math_reward.py`` with its ``utils.py``) returns on that response and
ground truth; a ``quirk`` comment marks a verdict that is not the mathematical one, kept for agreement.
"""

import time

import pytest

from collab.envs.math import deepscaler
from collab.envs.math.env import MathEnv
from collab.errors import UserError

# (response, ground truth or truths, the reference's verdict)
CASES = [
    # </think> splitting
    ("<think>I guess \\boxed{3}</think> So \\boxed{5}", "5", True),
    ("<think>I guess \\boxed{3}</think> So \\boxed{5}", "3", False),
    ("<think>\\boxed{5}</think> no box here", "5", False),
    # quirk: only the text between the first and a second </think>
    ("<think>a</think>\\boxed{5}</think>\\boxed{6}", "5", True),
    # quirk: only the text between the first and a second </think>
    ("<think>a</think>\\boxed{5}</think>\\boxed{6}", "6", False),
    ("<think>unfinished \\boxed{7}", "7", True),
    ("Work: \\boxed{4} then \\boxed{5}", "5", True),
    ("Work: \\boxed{4} then \\boxed{5}", "4", False),
    # nested braces
    ("\\boxed{\\frac{1}{2}}", "\\frac12", True),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", True),
    ("\\boxed{{5}}", "5", True),
    # quirk: an integer truth needs an integer string: no sympy
    ("\\boxed{2^{10}}", "1024", False),
    ("\\boxed{5", "5", False),
    ("$\\boxed{\\dfrac{3}{4}}$.", "\\frac{3}{4}", True),
    # \boxed 5, \fbox, bare boxed
    # quirk: a box needs braces
    ("\\boxed 5", "5", False),
    # quirk: a box needs braces
    ("The answer is \\boxed 5.", "5", False),
    # quirk: \fbox is never read (its branch sits behind a test for \boxed)
    ("\\fbox{5}", "5", False),
    # quirk: \fbox is never read
    ("\\boxed{3} and \\fbox{5}", "5", False),
    ("\\boxed{3} and \\fbox{5}", "3", True),
    ("boxed{5}", "5", False),
    # quirk: a box needs braces
    ("\\boxed 5 and later {6}", "5", False),
    # fractions
    ("\\boxed{\\frac12}", "1/2", True),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{0.5}", "\\frac{1}{2}", True),
    ("\\boxed{0.5}", "1/2", True),
    ("\\boxed{.5}", "1/2", True),
    ("\\boxed{0.25}", "\\frac{1}{4}", True),
    ("\\boxed{2/4}", "1/2", False),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", False),
    ("\\boxed{\\tfrac{3}{4}}", "0.75", True),
    ("\\boxed{1/3}", "0.333", False),
    ("\\boxed{-\\frac{1}{2}}", "-1/2", True),
    ("\\boxed{\\frac{1}{2}}", "\\frac{2}{4}", False),
    ("\\boxed{\\frac{-1}{2}}", "-\\frac{1}{2}", True),
    ("\\boxed{\\frac{10}{3}}", "10/3", True),
    # mixed numbers
    ("\\boxed{3/2}", "1\\frac{1}{2}", True),
    ("\\boxed{1\\frac{1}{2}}", "\\frac{3}{2}", True),
    ("\\boxed{7 3/4}", "31/4", True),
    ("\\boxed{2\\frac12}", "5/2", True),
    # quirk: a negative mixed number reads as -2 + 1/2
    ("\\boxed{-2\\frac{1}{2}}", "-5/2", False),
    # units and text
    ("\\boxed{5\\text{ cm}}", "5", True),
    ("\\boxed{5 \\text{cm}}", "5", True),
    ("\\boxed{\\text{5 meters}}", "5", True),
    ("\\boxed{90^\\circ}", "90", True),
    ("\\boxed{90^{\\circ}}", "90", True),
    ("\\boxed{45 degrees}", "45", True),
    ("\\boxed{50\\%}", "50", True),
    ("\\boxed{50\\%}", "0.5", False),
    ("\\boxed{\\$18}", "18", True),
    # quirk: dollars is not among the units dropped
    ("\\boxed{18 dollars}", "18", False),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{\\text{Monday}}", "Monday", True),
    ("\\boxed{monday}", "Monday", True),
    ("\\boxed{3 hours}", "3", True),
    # quirk: 2*10^6 is no integer string, the truth is one
    ("\\boxed{2 million}", "2000000", False),
    ("\\boxed{5 inches}", "5", True),
    ("\\boxed{\\text{east}}", "East", True),
    ("\\boxed{\\text{A}}", "(A)", True),
    # quirk: two \text{ units: MATH's clean-up gives up
    ("\\boxed{5\\text{ m}\\text{ s}}", "5", False),
    # commas in numbers
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{1{,}000}", "1000", True),
    ("\\boxed{1,000,000}", "1000000", True),
    ("\\boxed{1,00}", "100", False),
    ("\\boxed{1, 2}", "1,2", True),
    # quirk: an unbracketed list is one sympy expression: order counts
    ("\\boxed{2, 1}", "1, 2", False),
    ("\\boxed{1,000.5}", "1000.5", True),
    ("\\boxed{1,\\!000}", "1000", True),
    # tuples and intervals
    ("\\boxed{(1, 2)}", "(1,2)", True),
    ("\\boxed{(2, 1)}", "(1,2)", False),
    ("\\boxed{[1, 2)}", "(1,2)", False),
    ("\\boxed{(1,2]}", "(1,2]", True),
    ("\\boxed{(0.5, 2)}", "(\\frac{1}{2}, 2)", True),
    ("\\boxed{(1,2,3)}", "(1,2)", False),
    ("\\boxed{\\left(1, 2\\right)}", "(1,2)", True),
    ("\\boxed{(-\\infty, 3)}", "(-\\infty,3)", True),
    ("\\boxed{(-\\infty, 3]}", "(-\\infty, 3)", False),
    ("\\boxed{[2, 5]}", "[2,5]", True),
    ("\\boxed{(1,2) \\cup (3,4)}", "(1,2)\\cup(3,4)", True),
    ("\\boxed{x \\in (1,2)}", "(1,2)", False),
    ("\\boxed{(3, -1)}", "(3,-1)", True),
    ("\\boxed{(1,000, 2)}", "(1000,2)", True),
    # quirk: an integer truth needs an integer string
    ("\\boxed{(2, 4/2)}", "(2,2)", False),
    ("\\boxed{1 \\text{ and } 2}", "1, 2", True),
    ("\\boxed{1 or 2}", "1, 2", True),
    # square roots
    ("\\boxed{\\sqrt{2}}", "\\sqrt2", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}", True),
    ("\\boxed{1.414}", "\\sqrt{2}", False),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", False),
    ("\\boxed{3\\sqrt{2}}", "\\sqrt{18}", True),
    ("\\boxed{\\sqrt}", "\\sqrt", True),
    # pi
    ("\\boxed{2\\pi}", "2\\pi", True),
    ("\\boxed{2 \\pi}", "2\\pi", True),
    ("\\boxed{\\frac{\\pi}{2}}", "\\pi/2", True),
    ("\\boxed{6.28}", "2\\pi", False),
    ("\\boxed{4\\pi}", "\\pi \\cdot 4", True),
    ("\\boxed{\\pi}", "3.14159", False),
    # expressions with variables
    ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("\\boxed{x^2+2x+1}", "(x+1)^{2}", True),
    ("\\boxed{x^2-1}", "(x-1)(x+1)", True),
    ("\\boxed{x^2+1}", "(x+1)^2", False),
    ("\\boxed{2x}", "x+x", True),
    # quirk: three letters: sympy is not asked
    ("\\boxed{a+b+c}", "c+b+a", False),
    ("\\boxed{y = 2x + 3}", "2x+3", True),
    ("\\boxed{x = 5}", "5", True),
    ("\\boxed{ab}", "ba", True),
    ("\\boxed{x^{10}}", "x^10", True),
    ("\\boxed{x^{2}+1}", "1+x^2", True),
    # quirk: an integer truth needs an integer string
    ("\\boxed{2^{3}}", "8", False),
    ("\\boxed{\\frac{x}{2}}", "x/2", True),
    # quirk: e, x, p: three letters
    ("\\boxed{e^x}", "\\exp(x)", False),
    ("\\boxed{x > 2}", "x>2", True),
    # quirk: an exponent of two digits: sympy is not asked
    ("\\boxed{2^{99} \\cdot 2}", "2^{100}", False),
    ("\\boxed{9^9^9}", "y", False),
    # quirk: ^( : sympy is not asked
    ("\\boxed{(x+1)^(2)}", "x^2+2x+1", False),
    ("\\boxed{x^2 y}", "y x^2", True),
    # matrices
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\boxed{\\begin{pmatrix}1\\\\2\\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
    ("\\boxed{\\begin{pmatrix} 2 \\\\ 1 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", False),
    # quirk: matrices compare as text
    (
        "\\boxed{\\begin{pmatrix} 0.5 \\\\ 2 \\end{pmatrix}}",
        "\\begin{pmatrix} \\frac{1}{2} \\\\ 2 \\end{pmatrix}",
        False,
    ),
    # several ground truths
    ("\\boxed{10}", ["10", "x^4"], True),
    (
        "<think>...</think>\nSo \\boxed{24 + 14*x + (-13)*x^2 - 2*x^3 + x^4}.",
        ["10", "$x^{4}-2 x^{3}-13 x^{2}+14 x+24$"],
        True,
    ),
    ("\\boxed{7}", ["10", "12"], False),
    ("\\boxed{12}", ("10", "12"), True),
    ("\\boxed{12}", [], False),
    # boxed ground truths
    ("\\boxed{5}", "\\boxed{5}", True),
    ("\\boxed{5}", "The answer is $\\boxed{5}$.", True),
    ("\\boxed{5}", ["\\boxed{6", "5"], True),
    ("\\boxed{5}", ["\\boxed{6"], False),
    ("\\boxed{5}", "\\fbox{5}", True),
    ("\\boxed{5}", "\\boxed{\\boxed{5}}", True),
    # quirk: a truth whose box does not open with a brace is dropped
    ("\\boxed{5}", "\\boxed 5", False),
    # non-string ground truths
    ("\\boxed{5}", 5, True),
    ("\\boxed{2.5}", 2.5, True),
    ("\\boxed{5.0}", "5", True),
    ("\\boxed{5}", None, False),
    ("\\boxed{3}", 3.0, True),
    # empty, None, no box
    ("", "5", False),
    (None, "5", False),
    ("The answer is 5.", "5", False),
    ("\\boxed{}", "5", False),
    # quirk: an empty box equals an empty truth
    ("\\boxed{}", "", True),
    ("\\boxed{ 5 }", "5", True),
    # numbers
    ("\\boxed{-5}", "-5", True),
    ("\\boxed{- 5}", "-5", True),
    ("\\boxed{005}", "5", True),
    ("\\boxed{079}", "79", True),
    ("\\boxed{\\infty}", "\\infty", True),
    ("\\boxed{1e3}", "1000", True),
    ("\\boxed{3.14}", "3.14159", False),
    # quirk: sympy's floats: 0.1 + 0.2 - 0.3 is not 0
    ("\\boxed{0.1+0.2}", "0.3", False),
    ("\\boxed{A}", "a", True),
    ("\\boxed{5}\n\nThe \\boxed{answer}", "5", False),
    ("\\boxed{2^{100}}", "2^{100}", True),
    ("\\boxed{k = 3}", "3", True),
    ("\\boxed{abc = 3}", "3", False),
    ("\\boxed{6}", "6.0", True),
    ("\\boxed{10\\%}", "10", True),
    # powers written with ** (sympy's own spelling)
    ("\\boxed{x**2}", "x^2", True),
    ("\\boxed{x^-2}", "1/x^2", True),
    # quirk: ^10: an exponent of two digits, sympy is not asked
    ("\\boxed{x^-10}", "1/x^10", False),
    # quirk: an exponent of two digits: sympy is not asked
    ("\\boxed{2**10}", "2^{10}", False),
]


@pytest.mark.parametrize(("response", "truths", "expected"), CASES)
def test_verdict_is_the_references(response, truths, expected):
    assert deepscaler.grade(response, truths) is expected


def test_the_table_holds_both_verdicts_on_every_kind_of_case():
    verdicts = [expected for _, _, expected in CASES]
    assert len(CASES) >= 100 and verdicts.count(True) >= 40 and verdicts.count(False) >= 40


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ("<think>\\boxed{1}</think>\\boxed{\\frac{a}{b}} and \\boxed{2}", "2"),
        ("no think: \\boxed{x} then \\boxed{{y}}", "{y}"),
        ("<think>\\boxed{1}</think> none", None),
        ("\\boxed{open", None),
        ("\\fbox{3}", None),
        ("", None),
        (None, None),
    ],
)
def test_final_answer(response, answer):
    assert deepscaler.final_answer(response) == answer


@pytest.mark.parametrize(
    ("answer", "normal"),
    [
        ("\\text{5}", "5"),
        ("\\dfrac12", "\\frac{1}{2}"),
        ("0.5", "\\frac{1}{2}"),
        ("3/4", "\\frac{3}{4}"),
        ("x = \\sqrt3", "\\sqrt{3}"),
        ("5\\text{ cm}", "5"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("90^\\circ", "90"),
        ("\\frac", "\\frac"),  # malformed: the answer itself
    ],
)
def test_mathd_normalize(answer, normal):
    assert deepscaler.mathd_normalize(answer) == normal


@pytest.mark.parametrize(
    ("expr", "normal"),
    [
        ("\\frac{1}{2}", "1/2"),
        ("2\\sqrt{2}", "2sqrt(2)"),
        ("7 3/4", "7+3/4"),
        ("1,000", "1000"),
        ("5.0", "5"),
        ("45 degrees", "45"),
        ("\\text{Monday}", "mon"),  # "day" is a unit: both sides lose it alike
        ("3 million", "3*10^6"),
    ],
)
def test_sympy_normalize(expr, normal):
    assert deepscaler.sympy_normalize(expr) == normal


def test_powers_that_would_keep_sympy_busy_are_refused_at_once():
    # the reference has no timeout and evaluates these for minutes; collab applies its exponent guards to them too
    start = time.monotonic()
    assert not deepscaler.grade("\\boxed{10**10**10}", "y")
    assert not deepscaler.grade("\\boxed{10^-999999}", "y")
    assert time.monotonic() - start < 5


def test_kept_difference_a_parenthesised_power_spelled_with_stars():
    # the reference accepts x**(2) for x^2 (its "^(" guard misses "**("); collab refuses it, as it refuses x^(2)
    assert not deepscaler.grade("\\boxed{x**(2)}", "x^2")
    assert not deepscaler.grade("\\boxed{x^(2)}", "x^2")
    assert deepscaler.grade("\\boxed{x**2}", "x^2")


# (the graded agent's text, the gold answer, deepscaler's (reward, info), collab's (reward, info))
ENV_CASES = [
    ("So \\boxed{\\frac{2}{4}}", "1/2", (0.0, 1.0, 1.0), (1.0, 1.0, 1.0)),  # unreduced: wrong for DeepScaleR
    ("The answer is 5", "5", (0.0, 0.0, 0.0), (1.0, 1.0, 0.0)),  # no box: no fallback for DeepScaleR
    ("\\boxed{x^2+2x+1}", "(x+1)^2", (1.0, 1.0, 1.0), (0.0, 1.0, 1.0)),  # sympy equality; collab has no algebra
    ("<think>\\boxed{5}</think> five", "5", (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # only after </think>
]


def info(correct, answered, boxed):
    return correct, {"correct": correct, "answered": answered, "boxed": boxed}


@pytest.mark.parametrize(("text", "gold", "deep", "default"), ENV_CASES)
def test_math_env_grader_option(text, gold, deep, default):
    task = {"problem": "?", "answer": gold}
    assert MathEnv(dataset="small_addition", grader="deepscaler").grade(task, text) == info(*deep)
    assert MathEnv(dataset="small_addition").grade(task, text) == info(*default)
    assert MathEnv(dataset="small_addition", grader="collab").grade(task, text) == info(*default)


def test_math_env_refuses_an_unknown_grader_in_one_line():
    with pytest.raises(UserError) as error:
        MathEnv(dataset="small_addition", grader="sympy")
    message = str(error.value)
    assert "\n" not in message and "'sympy'" in message and "valid: collab, deepscaler" in message
