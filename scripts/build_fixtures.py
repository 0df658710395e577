"""Write the embedded task fixtures in the original MBPP and APPS schemas.

    python scripts/build_fixtures.py        # rewrites data/embedded/{mbpp,apps}_fixtures.jsonl

The problems are written for this project (none is copied from a benchmark). Expected outputs are
not typed by hand: each reference solution below (trusted code written here) is run in-process on
the test inputs, so a fixture can never disagree with its own reference. The files are committed;
this script documents where they come from and regenerates them byte-identically.

The spread runs from one-line functions that SmolLM2-135M solves now and then (the CPU run needs a
nonzero reward signal) to moderate algorithmic problems.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any, List  # noqa: F401,UP035  (reference solutions use typing.List like APPS)

OUT = Path(__file__).resolve().parent.parent / "data" / "embedded"

# --------------------------------------------------------------------------------------------
# MBPP-format problems: (text, function name, reference code, three argument tuples,
# optional challenge argument tuples, optional test_setup_code + asserts overriding the default)
# --------------------------------------------------------------------------------------------

MBPP_PROBLEMS: list[tuple[Any, ...]] = [
    (
        "Write a function to add two numbers.",
        "add_numbers",
        "def add_numbers(a, b):\n    return a + b",
        [(1, 2), (10, -4), (0, 0)],
    ),
    (
        "Write a function that returns the square of a number.",
        "square",
        "def square(n):\n    return n * n",
        [(3,), (-4,), (0,)],
    ),
    (
        "Write a function to check whether a number is even.",
        "is_even",
        "def is_even(n):\n    return n % 2 == 0",
        [(4,), (7,), (0,)],
    ),
    (
        "Write a function to reverse a string.",
        "reverse_string",
        "def reverse_string(s):\n    return s[::-1]",
        [("hello",), ("ab",), ("",)],
    ),
    (
        "Write a function that returns the larger of two numbers.",
        "max_of_two",
        "def max_of_two(a, b):\n\tif a > b:\n\t\treturn a\n\treturn b",
        [(3, 9), (12, 5), (-1, -1)],
    ),
    (
        "Write a function to find the number of elements in a list.",
        "list_length",
        "def list_length(items):\n    return len(items)",
        [([1, 2, 3],), ([],), (["a"],)],
    ),
    (
        "Write a function to convert a string to upper case.",
        "to_upper",
        "def to_upper(s):\n    return s.upper()",
        [("python",), ("Hello World",), ("123abc",)],
    ),
    (
        "Write a function to get the first element of a list.",
        "first_element",
        "def first_element(items):\n    return items[0]",
        [([5, 6, 7],), (["x", "y"],), ([0],)],
    ),
    (
        "Write a function to get the last element of a list.",
        "last_element",
        "def last_element(items):\n    return items[-1]",
        [([5, 6, 7],), (["x", "y"],), ([0],)],
    ),
    (
        "Write a function to join two strings together.",
        "concat_strings",
        "def concat_strings(a, b):\n    return a + b",
        [("foo", "bar"), ("", "x"), ("a b", " c")],
    ),
    (
        "Write a function to multiply two numbers.",
        "multiply",
        "def multiply(a, b):\n    return a * b",
        [(3, 4), (-2, 5), (7, 0)],
    ),
    (
        "Write a function to find the absolute value of a number without using abs().",
        "absolute_value",
        "def absolute_value(n):\n    return -n if n < 0 else n",
        [(-5,), (3,), (0,)],
    ),
    (
        "Write a function to find the sum of all numbers in a list.",
        "sum_list",
        "def sum_list(numbers):\n    total = 0\n    for x in numbers:\n        total += x\n    return total",
        [([1, 2, 3],), ([],), ([-1, 1, 10],)],
    ),
    (
        "Write a function to count how many times a character occurs in a string.",
        "count_char",
        "def count_char(s, c):\n    return s.count(c)",
        [("banana", "a"), ("hello", "z"), ("aaa", "a")],
    ),
    (
        "Write a function to check whether a number is strictly positive.",
        "is_positive",
        "def is_positive(n):\n    return n > 0",
        [(5,), (-3,), (0,)],
    ),
    (
        "Write a function that doubles every number in a list.",
        "double_list",
        "def double_list(numbers):\n    return [2 * x for x in numbers]",
        [([1, 2, 3],), ([],), ([-4, 0],)],
    ),
    (
        "Write a function to find the smallest of three numbers.",
        "min_of_three",
        "def min_of_three(a, b, c):\n    return min(a, b, c)",
        [(3, 1, 2), (5, 5, 9), (-1, -7, 0)],
    ),
    (
        "Write a function to convert a temperature from Celsius to Fahrenheit.",
        "celsius_to_fahrenheit",
        "def celsius_to_fahrenheit(c):\n    return c * 9 / 5 + 32",
        [(0,), (100,), (-40,)],
    ),
    (
        "Write a function to compute the area of a rectangle from its length and width.",
        "rectangle_area",
        "def rectangle_area(length, width):\n    return length * width",
        [(3, 4), (10, 1), (0, 5)],
    ),
    (
        "Write a function to check whether a string is a palindrome.",
        "is_palindrome",
        "def is_palindrome(s):\n    return s == s[::-1]",
        [("racecar",), ("hello",), ("a",)],
    ),
    (
        "Write a function to compute the factorial of a non-negative integer.",
        "factorial",
        "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n        result *= i\n    return result",
        [(0,), (5,), (10,)],
    ),
    (
        "Write a function to find the n-th Fibonacci number, where fib(0) = 0 and fib(1) = 1.",
        "fibonacci",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a",
        [(0,), (1,), (10,)],
        [(30,)],
    ),
    (
        "Write a function to count the vowels (a, e, i, o, u, either case) in a string.",
        "count_vowels",
        "def count_vowels(s):\n    return sum(1 for ch in s.lower() if ch in 'aeiou')",
        [("Hello World",), ("xyz",), ("AEIOU aeiou",)],
    ),
    (
        "Write a function to remove duplicates from a list while keeping the first occurrence of each element.",
        "remove_duplicates",
        "def remove_duplicates(items):\n    seen = set()\n    out = []\n    for x in items:\n        if x not in seen:\n"
        "            seen.add(x)\n            out.append(x)\n    return out",
        [([1, 2, 1, 3, 2],), ([],), (["a", "a", "b"],)],
    ),
    (
        "Write a function to check whether a number is prime.",
        "is_prime",
        "def is_prime(n):\n    if n < 2:\n        return False\n    d = 2\n    while d * d <= n:\n        if n % d == 0:\n"
        "            return False\n        d += 1\n    return True",
        [(2,), (15,), (97,)],
        [(1,), (7919,)],
    ),
    (
        "Write a function to find the greatest common divisor of two positive integers.",
        "gcd",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a",
        [(12, 18), (7, 13), (100, 75)],
    ),
    (
        "Write a function to count the words in a sentence (words are separated by spaces).",
        "word_count",
        "def word_count(sentence):\n    return len(sentence.split())",
        [("the quick brown fox",), ("",), ("  many   spaces here ",)],
    ),
    (
        "Write a function to flatten a list of lists into a single list.",
        "flatten_list",
        "def flatten_list(nested):\n    return [x for sub in nested for x in sub]",
        [([[1, 2], [3], []],), ([],), ([["a"], ["b", "c"]],)],
    ),
    (
        "Write a function to find the second largest distinct number in a list.",
        "second_largest",
        "def second_largest(numbers):\n    distinct = sorted(set(numbers))\n    return distinct[-2]",
        [([1, 5, 3, 5],), ([10, 20],), ([-1, -2, -3],)],
    ),
    (
        "Write a function that returns a dictionary mapping each character of a string to its count.",
        "char_frequency",
        "def char_frequency(s):\n    counts = {}\n    for ch in s:\n        counts[ch] = counts.get(ch, 0) + 1\n    return counts",
        [("hello",), ("",), ("aab",)],
    ),
    (
        "Write a function to convert a binary string to its decimal value.",
        "binary_to_decimal",
        "def binary_to_decimal(bits):\n    value = 0\n    for b in bits:\n        value = value * 2 + int(b)\n    return value",
        [("101",), ("0",), ("11111111",)],
    ),
    (
        "Write a function to find the sum of the digits of a non-negative integer.",
        "sum_digits",
        "def sum_digits(n):\n\ttotal = 0\n\twhile n > 0:\n\t\ttotal += n % 10\n\t\tn //= 10\n\treturn total",
        [(123,), (0,), (9999,)],
    ),
    (
        "Write a function to capitalize the first letter of every word in a sentence.",
        "capitalize_words",
        "def capitalize_words(sentence):\n    return ' '.join(w[:1].upper() + w[1:] for w in sentence.split(' '))",
        [("hello world",), ("a",), ("python is fun",)],
    ),
    (
        "Write a function to merge two sorted lists into one sorted list.",
        "merge_sorted",
        "def merge_sorted(a, b):\n    i = j = 0\n    out = []\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
        "            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n"
        "    return out + a[i:] + b[j:]",
        [([1, 3, 5], [2, 4]), ([], [1]), ([1, 1], [1])],
    ),
    (
        "Write a function to rotate a list to the left by k positions.",
        "rotate_left",
        "def rotate_left(items, k):\n    if not items:\n        return []\n    k %= len(items)\n    return items[k:] + items[:k]",
        [([1, 2, 3, 4, 5], 2), ([1, 2], 3), ([], 1)],
    ),
    (
        "Write a function to count the words in a sentence that are longer than n characters.",
        "count_long_words",
        "def count_long_words(sentence, n):\n    return sum(1 for w in sentence.split() if len(w) > n)",
        [("the quick brown fox", 3), ("a bb ccc", 5), ("extraordinary words", 5)],
    ),
    (
        "Write a function to find the elements common to two lists, returned as a sorted list without duplicates.",
        "common_elements",
        "def common_elements(a, b):\n    return sorted(set(a) & set(b))",
        [([1, 2, 3, 4], [3, 4, 5]), ([1], [2]), ([100, 3, 50], [50, 100, 3, 7])],
    ),
    (
        "Write a function that returns the running sums of a list of numbers.",
        "running_sum",
        "def running_sum(numbers):\n    out, total = [], 0\n    for x in numbers:\n        total += x\n        out.append(total)\n    return out",
        [([1, 2, 3, 4],), ([],), ([5, -5, 5],)],
    ),
    (
        "Write a function to transpose a matrix given as a list of rows.",
        "transpose",
        "def transpose(matrix):\n    return [list(row) for row in zip(*matrix)]",
        [([[1, 2, 3], [4, 5, 6]],), ([[1]],), ([[1, 2], [3, 4]],)],
    ),
    (
        "Write a function to check whether two strings are anagrams of each other.",
        "is_anagram",
        "def is_anagram(a, b):\n    return sorted(a) == sorted(b)",
        [("listen", "silent"), ("abc", "abd"), ("", "")],
    ),
    (
        "Write a function to find the index of the first occurrence of an element in a list, or -1 if it is absent.",
        "find_index",
        "def find_index(items, x):\n    for i, item in enumerate(items):\n        if item == x:\n            return i\n    return -1",
        [([4, 5, 6], 5), ([4, 5, 6], 7), ([1, 1], 1)],
    ),
    (
        "Write a function that returns the list of squares of the integers from 1 to n.",
        "squares_up_to",
        "def squares_up_to(n):\n    return [i * i for i in range(1, n + 1)]",
        [(3,), (0,), (5,)],
    ),
    (
        "Write a function to find the longest word in a sentence (the first one if several are equally long).",
        "longest_word",
        "def longest_word(sentence):\n    best = ''\n    for w in sentence.split():\n        if len(w) > len(best):\n            best = w\n    return best",
        [("the quick brown fox",), ("a bb cc",), ("hello",)],
    ),
    (
        "Write a function to find the average of a list of numbers.",
        "average",
        "def average(numbers):\n    return sum(numbers) / len(numbers)",
        [([1, 2, 3, 4],), ([5],), ([-1, 1],)],
    ),
]

# A problem in the style of MBPP 367/927: test_setup_code builds objects from a class that the
# solution defines, so the setup code must run after the program.
MBPP_SETUP_PROBLEM: dict[str, Any] = {
    "text": "Write a class Stack with push and pop methods, and a function stack_size that returns how many items a Stack holds.",
    "code": "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n        self.items.append(x)\n\n"
    "    def pop(self):\n        return self.items.pop()\n\n\ndef stack_size(stack):\n    return len(stack.items)",
    "test_setup_code": "s1 = Stack()\ns2 = Stack()\ns2.push(1)\ns2.push(2)\ns3 = Stack()\ns3.push(7)\ns3.push(8)\ns3.pop()",
    "test_list": ["assert stack_size(s1) == 0", "assert stack_size(s2) == 2", "assert stack_size(s3) == 1"],
}

# --------------------------------------------------------------------------------------------
# APPS-format problems
# --------------------------------------------------------------------------------------------

STDIN_PROBLEMS: list[tuple[Any, ...]] = [
    # (difficulty, question, solution, inputs)
    (
        "introductory",
        "You are given two integers a and b. Print their sum.\n\n-----Input-----\n\nOne line with two integers a and b "
        "(-10^9 <= a, b <= 10^9).\n\n-----Output-----\n\nPrint a + b.\n\n-----Examples-----\nInput\n3 4\n\nOutput\n7",
        "a, b = map(int, input().split())\nprint(a + b)",
        ["3 4\n", "-5 5\n", "1000000000 1000000000\n", "0 -7\n"],
    ),
    (
        "introductory",
        "Given a string s, print it reversed.\n\n-----Input-----\n\nOne line containing s (1 <= |s| <= 100).\n\n"
        "-----Output-----\n\nPrint s reversed.\n\n-----Examples-----\nInput\nabc\n\nOutput\ncba",
        "print(input()[::-1])",
        ["abc\n", "racecar\n", "Hello, World\n"],
    ),
    (
        "introductory",
        "You are given n integers. Print the largest of them.\n\n-----Input-----\n\nThe first line contains n "
        "(1 <= n <= 100). The second line contains n integers.\n\n-----Output-----\n\nPrint the maximum.",
        "n = int(input())\nnums = list(map(int, input().split()))\nprint(max(nums))",
        ["3\n1 5 2\n", "1\n-4\n", "5\n-1 -2 -3 -4 -5\n"],
    ),
    (
        "introductory",
        "Count the vowels (a, e, i, o, u) in a line of lowercase text.\n\n-----Input-----\n\nOne line of text.\n\n"
        "-----Output-----\n\nPrint the number of vowels.",
        "s = input()\nprint(sum(ch in 'aeiou' for ch in s))",
        ["hello world\n", "rhythm\n", "aeiou\n"],
    ),
    (
        "introductory",
        "Print YES if the given integer is even and NO otherwise.\n\n-----Input-----\n\nOne integer n.\n\n"
        "-----Output-----\n\nYES or NO.",
        "n = int(input())\nprint('YES' if n % 2 == 0 else 'NO')",
        ["4\n", "7\n", "0\n", "-3\n"],
    ),
    (
        "introductory",
        "Print the integers from 1 to n, one per line.\n\n-----Input-----\n\nOne integer n (1 <= n <= 50).\n\n"
        "-----Output-----\n\nn lines.",
        "n = int(input())\nfor i in range(1, n + 1):\n    print(i)",
        ["3\n", "1\n", "6\n"],
    ),
    (
        "introductory",
        "For each of T test cases, print the product of two integers.\n\n-----Input-----\n\nThe first line contains T. "
        "Each of the next T lines contains two integers a and b.\n\n-----Output-----\n\nFor each test case print a*b on its own line.",
        "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a * b)",
        # inputs given as lists of lines, as some rows of the full APPS dataset do
        [["2", "3 4", "5 6"], ["1", "-2 8"], ["3", "0 9", "1 1", "10 10"]],
    ),
    (
        "introductory",
        "Print the sum of the digits of a non-negative integer n.\n\n-----Input-----\n\nOne integer n (0 <= n <= 10^18)."
        "\n\n-----Output-----\n\nThe digit sum.",
        "print(sum(int(c) for c in input().strip()))",
        ["123\n", "0\n", "999999999999999999\n"],
    ),
    (
        "interview",
        "Compute n! modulo 1000000007.\n\n-----Input-----\n\nOne integer n (0 <= n <= 10^5).\n\n-----Output-----\n\n"
        "n! mod 1000000007.",
        "n = int(input())\nr = 1\nfor i in range(2, n + 1):\n    r = r * i % 1000000007\nprint(r)",
        ["5\n", "0\n", "20\n", "100000\n"],
    ),
    (
        "introductory",
        "Sort n integers in non-decreasing order.\n\n-----Input-----\n\nThe first line contains n. The second line "
        "contains n integers.\n\n-----Output-----\n\nThe sorted integers separated by spaces.",
        "input()\nprint(' '.join(map(str, sorted(map(int, input().split())))))",
        ["4\n3 1 2 2\n", "1\n5\n", "5\n-1 10 -20 0 3\n"],
    ),
    (
        "interview",
        "Count the distinct words in a line of text. Words are separated by single spaces and compared case-sensitively."
        "\n\n-----Input-----\n\nOne line.\n\n-----Output-----\n\nThe number of distinct words.",
        "print(len(set(input().split())))",
        ["a b a c\n", "one\n", "x x x X\n"],
    ),
    (
        "interview",
        "Print the character that occurs most often in a string of lowercase letters. If several characters tie, print "
        "the alphabetically smallest.\n\n-----Input-----\n\nOne line.\n\n-----Output-----\n\nOne character.",
        "from collections import Counter\ns = input().strip()\nc = Counter(s)\nbest = max(c.values())\n"
        "print(min(ch for ch in c if c[ch] == best))",
        ["abracadabra\n", "zzyy\n", "q\n"],
    ),
    (
        "interview",
        "Count the prime numbers that are less than or equal to n.\n\n-----Input-----\n\nOne integer n (1 <= n <= 10^6)."
        "\n\n-----Output-----\n\nThe count.",
        "n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0:2] = b'\\x00\\x00'[: n + 1]\ni = 2\nwhile i * i <= n:\n"
        "    if sieve[i]:\n        sieve[i * i::i] = bytearray(len(range(i * i, n + 1, i)))\n    i += 1\nprint(sum(sieve))",
        ["10\n", "1\n", "100\n", "100000\n"],
    ),
    (
        "interview",
        "Transpose a matrix.\n\n-----Input-----\n\nThe first line contains r and c. Each of the next r lines contains c "
        "integers.\n\n-----Output-----\n\nc lines of r integers each: the transposed matrix.",
        "r, c = map(int, input().split())\nm = [input().split() for _ in range(r)]\nfor j in range(c):\n"
        "    print(' '.join(m[i][j] for i in range(r)))",
        ["2 3\n1 2 3\n4 5 6\n", "1 1\n9\n", "3 2\n1 2\n3 4\n5 6\n"],
    ),
    (
        "competition",
        "Find the length of the longest strictly increasing subsequence of a sequence.\n\n-----Input-----\n\nThe first "
        "line contains n (1 <= n <= 10^5). The second line contains n integers.\n\n-----Output-----\n\nThe length.",
        "import bisect\ninput()\ntails = []\nfor x in map(int, input().split()):\n    i = bisect.bisect_left(tails, x)\n"
        "    if i == len(tails):\n        tails.append(x)\n    else:\n        tails[i] = x\nprint(len(tails))",
        ["6\n10 9 2 5 3 7\n", "1\n5\n", "5\n1 2 3 4 5\n", "4\n4 3 2 1\n"],
    ),
    (
        "competition",
        "A staircase has n steps. You climb 1 or 2 steps at a time. Print the number of different ways to reach the "
        "top, modulo 1000000007.\n\n-----Input-----\n\nOne integer n (1 <= n <= 10^6).\n\n-----Output-----\n\nThe count.",
        "n = int(input())\na, b = 1, 1\nfor _ in range(n - 1):\n    a, b = b, (a + b) % 1000000007\nprint(b)",
        ["1\n", "2\n", "10\n", "100000\n"],
    ),
    (
        "introductory",
        "Print the average of n numbers with exactly six digits after the decimal point.\n\n-----Input-----\n\nThe first "
        "line contains n. The second line contains n integers.\n\n-----Output-----\n\nThe average.",
        "n = int(input())\nnums = list(map(int, input().split()))\nprint('%.6f' % (sum(nums) / n))",
        ["3\n1 2 4\n", "1\n5\n", "4\n-1 -2 3 7\n"],
    ),
]

CALL_PROBLEMS: list[tuple[Any, ...]] = [
    # (difficulty, question, starter_code, fn_name, solution, argument lists, wrap outputs in a list?)
    (
        "introductory",
        "Given a non-negative integer num, repeatedly add all its digits until the result has only one digit, and "
        "return it.\n\nExample:\nInput: 38\nOutput: 2 (3 + 8 = 11, 1 + 1 = 2)",
        "\nclass Solution:\n    def addDigits(self, num: int) -> int:\n        ",
        "addDigits",
        "class Solution:\n    def addDigits(self, num: int) -> int:\n        while num >= 10:\n"
        "            num = sum(int(d) for d in str(num))\n        return num",
        [[38], [0], [9999], [10]],
        False,
    ),
    (
        "introductory",
        "Given a string, determine if it is a palindrome considering only alphanumeric characters and ignoring case.\n\n"
        'Example:\nInput: "A man, a plan, a canal: Panama"\nOutput: true',
        "\nclass Solution:\n    def isPalindrome(self, s: str) -> bool:\n        ",
        "isPalindrome",
        "class Solution:\n    def isPalindrome(self, s: str) -> bool:\n        t = [c.lower() for c in s if c.isalnum()]\n"
        "        return t == t[::-1]",
        [["A man, a plan, a canal: Panama"], ["race a car"], [""], ["0P"]],
        False,
    ),
    (
        "interview",
        "Given an integer array nums, find the contiguous subarray (containing at least one number) which has the "
        "largest sum and return its sum.\n\nExample:\nInput: [-2,1,-3,4,-1,2,1,-5,4]\nOutput: 6",
        "\nclass Solution:\n    def maxSubArray(self, nums: List[int]) -> int:\n        ",
        "maxSubArray",
        "class Solution:\n    def maxSubArray(self, nums: List[int]) -> int:\n        best = cur = nums[0]\n"
        "        for x in nums[1:]:\n            cur = max(x, cur + x)\n            best = max(best, cur)\n        return best",
        [[[-2, 1, -3, 4, -1, 2, 1, -5, 4]], [[1]], [[-3, -1, -2]], [[5, 4, -1, 7, 8]]],
        False,
    ),
    (
        "introductory",
        "Given a string s of words separated by spaces, return the words in reverse order joined by single spaces. "
        'Leading, trailing and repeated spaces are removed.\n\nExample:\nInput: "  hello world  "\nOutput: "world hello"',
        "\nclass Solution:\n    def reverseWords(self, s: str) -> str:\n        ",
        "reverseWords",
        "class Solution:\n    def reverseWords(self, s: str) -> str:\n        return ' '.join(reversed(s.split()))",
        [["the sky is blue"], ["  hello world  "], ["a"]],
        False,
    ),
    (
        "introductory",
        "You are climbing a staircase of n steps, taking 1 or 2 steps at a time. Return the number of distinct ways to "
        "reach the top.\n\nExample:\nInput: 3\nOutput: 3",
        "\nclass Solution:\n    def climbStairs(self, n: int) -> int:\n        ",
        "climbStairs",
        "class Solution:\n    def climbStairs(self, n: int) -> int:\n        a, b = 1, 1\n        for _ in range(n - 1):\n"
        "            a, b = b, a + b\n        return b",
        [[1], [2], [3], [10]],
        False,
    ),
    (
        "interview",
        "Given a list of intervals [start, end], merge all overlapping intervals and return them sorted by start.\n\n"
        "Example:\nInput: [[1,3],[2,6],[8,10]]\nOutput: [[1,6],[8,10]]",
        "\nclass Solution:\n    def merge(self, intervals: List[List[int]]) -> List[List[int]]:\n        ",
        "merge",
        "class Solution:\n    def merge(self, intervals: List[List[int]]) -> List[List[int]]:\n        out = []\n"
        "        for s, e in sorted(intervals):\n            if out and s <= out[-1][1]:\n                out[-1][1] = max(out[-1][1], e)\n"
        "            else:\n                out.append([s, e])\n        return out",
        [[[[1, 3], [2, 6], [8, 10]]], [[[1, 4], [4, 5]]], [[[5, 6]]]],
        False,
    ),
    (
        "introductory",
        "Write a function that returns true if the given integer is even and false otherwise.",
        "\ndef is_even(n):\n\t",
        "is_even",
        "def is_even(n):\n    return n % 2 == 0",
        [[2], [7], [0], [-4]],
        True,
    ),
    (
        "introductory",
        "Return the sum of all the multiples of 3 or 5 strictly below n. For a negative n return 0.",
        "\ndef sum_of_multiples(n):\n\t",
        "sum_of_multiples",
        "def sum_of_multiples(n):\n    return sum(i for i in range(max(n, 0)) if i % 3 == 0 or i % 5 == 0)",
        [[10], [20], [0], [-5]],
        True,
    ),
    (
        "interview",
        "Convert a dash- or underscore-delimited string to camel case. The first word keeps its capitalization.\n\n"
        'Examples:\n"the-stealth-warrior" gets converted to "theStealthWarrior"\n"The_Stealth_Warrior" gets converted to '
        '"TheStealthWarrior"',
        "\ndef to_camel_case(text):\n\t",
        "to_camel_case",
        "import re\n\ndef to_camel_case(text):\n    parts = re.split('[-_]', text)\n"
        "    return parts[0] + ''.join(p[:1].upper() + p[1:] for p in parts[1:])",
        [["the-stealth-warrior"], ["The_Stealth_Warrior"], [""], ["a-b-c"]],
        False,
    ),
]


def _run_function(code: str, fn_name: str, args: tuple | list):
    namespace: dict = {"List": list}
    exec(code, namespace)  # noqa: S102 - trusted reference code written in this file
    if "class Solution" in code:
        return getattr(namespace["Solution"](), fn_name)(*args)
    return namespace[fn_name](*args)


def _run_stdin(code: str, stdin: str) -> str:
    out = io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, {"__name__": "__main__"})  # noqa: S102 - trusted reference code
    finally:
        sys.stdin = old_stdin
    return out.getvalue()


def build_mbpp_rows() -> list[dict]:
    rows = []
    for index, problem in enumerate(MBPP_PROBLEMS):
        text, fn_name, code, cases = problem[:4]
        challenge = problem[4] if len(problem) > 4 else []

        def assert_line(args, fn_name=fn_name, code=code):
            call = f"{fn_name}({', '.join(repr(a) for a in args)})"
            return f"assert {call} == {_run_function(code, fn_name, args)!r}"

        rows.append(
            {
                "text": text,
                "code": code.replace("\n", "\r\n"),  # MBPP's reference code uses CRLF; keep the quirk
                "task_id": 9001 + index,
                "test_setup_code": "",
                "test_list": [assert_line(args) for args in cases],
                "challenge_test_list": [assert_line(args) for args in challenge],
            }
        )
    setup = dict(MBPP_SETUP_PROBLEM, task_id=9001 + len(MBPP_PROBLEMS), challenge_test_list=[])
    namespace: dict = {}
    exec(setup["code"] + "\n" + setup["test_setup_code"] + "\n" + "\n".join(setup["test_list"]), namespace)  # noqa: S102
    rows.append(
        {k: setup[k] for k in ("text", "code", "task_id", "test_setup_code", "test_list", "challenge_test_list")}
    )
    return rows


def build_apps_rows() -> list[dict]:
    rows = []
    problem_id = 90001
    for difficulty, question, code, inputs in STDIN_PROBLEMS:
        outputs: list[Any] = []
        for given in inputs:
            text = "\n".join(given) + "\n" if isinstance(given, list) else given
            result = _run_stdin(code, text)
            outputs.append(result.splitlines() if isinstance(given, list) else result)
        rows.append(
            {
                "problem_id": problem_id,
                "question": question,
                "solutions": json.dumps([code]),
                "input_output": json.dumps({"inputs": inputs, "outputs": outputs}),
                "difficulty": difficulty,
                "url": "",
                "starter_code": "",
            }
        )
        problem_id += 1
    for difficulty, question, starter, fn_name, code, arg_lists, wrap in CALL_PROBLEMS:
        outputs = [_run_function(code, fn_name, args) for args in arg_lists]
        if wrap:  # Codewars-style rows wrap each expected value in a one-element list
            outputs = [[o] for o in outputs]
        rows.append(
            {
                "problem_id": problem_id,
                "question": question,
                "solutions": json.dumps([code]),
                "input_output": json.dumps({"fn_name": fn_name, "inputs": arg_lists, "outputs": outputs}),
                "difficulty": difficulty,
                "url": "",
                "starter_code": starter,
            }
        )
        problem_id += 1
    return rows


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} problems to {path}")


if __name__ == "__main__":
    write(OUT / "mbpp_fixtures.jsonl", build_mbpp_rows())
    write(OUT / "apps_fixtures.jsonl", build_apps_rows())
