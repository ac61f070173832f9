"""Generated reasoning data: GSM8k-style word problems with worked answers, counting and modular tasks.

Each generator takes a ``random.Random`` and returns ``(question, worked_answer)``; the worked answer
ends with ``#### <result>`` as in GSM8k.
"""

from __future__ import annotations

import random
from collections.abc import Callable

NAMES = (
    "Ava",
    "Ben",
    "Chloe",
    "Dev",
    "Elena",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jonas",
    "Keiko",
    "Liam",
    "Maya",
    "Noah",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
)
ITEMS = ("pencils", "apples", "stickers", "marbles", "books", "cookies", "stamps", "shells")
WORDS = (
    "strawberry",
    "banana",
    "mississippi",
    "recurrence",
    "parallel",
    "bookkeeper",
    "committee",
    "assessment",
    "letter",
    "balloon",
    "coffee",
    "programming",
    "occurrence",
    "tennessee",
)
FRUITS = ("apple", "pear", "plum", "fig", "kiwi", "lime")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

Task = tuple[str, str]


def _packs(rng: random.Random) -> Task:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    packs, per, extra = rng.randint(2, 12), rng.randint(3, 25), rng.randint(1, 30)
    total = packs * per
    given = rng.randint(1, total - 1)
    result = total + extra - given
    question = (
        f"{name} buys {packs} packs of {item} with {per} {item} in each pack. "
        f"{name} already had {extra} {item} and then gives away {given}. "
        f"How many {item} does {name} have now?"
    )
    answer = (
        f"The packs hold {packs} * {per} = {total} {item}.\n"
        f"With the ones {name} already had: {total} + {extra} = {total + extra}.\n"
        f"After giving some away: {total + extra} - {given} = {result}.\n#### {result}"
    )
    return question, answer


def _wages(rng: random.Random) -> Task:
    name = rng.choice(NAMES)
    rate, hours, days = rng.randint(8, 40), rng.randint(2, 9), rng.randint(2, 6)
    daily = rate * hours
    earned = daily * days
    spent = rng.randint(1, earned - 1)
    result = earned - spent
    question = (
        f"{name} earns ${rate} per hour and works {hours} hours a day for {days} days. "
        f"{name} spends ${spent} on groceries. How much money does {name} have left?"
    )
    answer = (
        f"Each day {name} earns {rate} * {hours} = ${daily}.\n"
        f"Over {days} days that is {daily} * {days} = ${earned}.\n"
        f"After spending: {earned} - {spent} = ${result}.\n#### {result}"
    )
    return question, answer


def _sharing(rng: random.Random) -> Task:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    friends, each, left = rng.randint(2, 9), rng.randint(2, 15), 0
    left = rng.randint(0, friends - 1)
    total = friends * each + left
    question = (
        f"{name} has {total} {item} and shares them equally among {friends} friends, "
        f"keeping whatever is left over. How many {item} does each friend get, and how many "
        f"does {name} keep?"
    )
    answer = (
        f"{total} divided by {friends} is {each} with remainder {left}, because "
        f"{friends} * {each} = {friends * each} and {total} - {friends * each} = {left}.\n"
        f"Each friend gets {each} and {name} keeps {left}.\n#### {each}, {left}"
    )
    return question, answer


def _travel(rng: random.Random) -> Task:
    v1, t1, v2, t2 = (
        rng.randint(20, 120),
        rng.randint(1, 6),
        rng.randint(20, 120),
        rng.randint(1, 6),
    )
    d1, d2 = v1 * t1, v2 * t2
    question = (
        f"A train travels at {v1} km per hour for {t1} hours, then at {v2} km per hour for "
        f"{t2} more hours. How far does it travel in total?"
    )
    answer = (
        f"First part: {v1} * {t1} = {d1} km.\nSecond part: {v2} * {t2} = {d2} km.\n"
        f"Total: {d1} + {d2} = {d1 + d2} km.\n#### {d1 + d2}"
    )
    return question, answer


def _ages(rng: random.Random) -> Task:
    a, b = rng.sample(NAMES, 2)
    age, factor, years = rng.randint(3, 15), rng.randint(2, 5), rng.randint(1, 20)
    older = age * factor
    result = age + older + 2 * years
    question = (
        f"{a} is {age} years old. {b} is {factor} times as old as {a}. "
        f"What will the sum of their ages be in {years} years?"
    )
    answer = (
        f"{b} is {age} * {factor} = {older} years old.\n"
        f"Now their ages sum to {age} + {older} = {age + older}.\n"
        f"In {years} years each is {years} older: {age + older} + 2 * {years} = {result}.\n"
        f"#### {result}"
    )
    return question, answer


def _sale(rng: random.Random) -> Task:
    name, item = rng.choice(NAMES), rng.choice(("lamp", "backpack", "kettle", "scarf", "puzzle"))
    price = rng.randint(10, 90)
    discount = rng.randint(1, price - 1)
    count = rng.randint(2, 8)
    unit = price - discount
    question = (
        f"A {item} costs ${price}. During a sale the price drops by ${discount}. "
        f"{name} buys {count} of them. How much does {name} pay?"
    )
    answer = (
        f"The sale price is {price} - {discount} = ${unit}.\n"
        f"For {count} of them: {unit} * {count} = ${unit * count}.\n#### {unit * count}"
    )
    return question, answer


def _baking(rng: random.Random) -> Task:
    name = rng.choice(NAMES)
    trays, per, eaten, price = (
        rng.randint(2, 8),
        rng.randint(6, 24),
        rng.randint(1, 5),
        rng.randint(1, 4),
    )
    baked = trays * per
    sold = baked - eaten
    question = (
        f"{name} bakes {trays} trays of {per} cookies, eats {eaten} of them and sells the rest "
        f"for ${price} each. How much money does {name} make?"
    )
    answer = (
        f"{name} bakes {trays} * {per} = {baked} cookies.\n"
        f"{baked} - {eaten} = {sold} are sold.\n"
        f"{sold} * {price} = ${sold * price}.\n#### {sold * price}"
    )
    return question, answer


WORD_PROBLEMS: tuple[Callable[[random.Random], Task], ...] = (
    _packs,
    _wages,
    _sharing,
    _travel,
    _ages,
    _sale,
    _baking,
)


def _letters(rng: random.Random) -> Task:
    word = rng.choice(WORDS)
    letter = rng.choice(sorted(set(word)))
    positions = [i + 1 for i, ch in enumerate(word) if ch == letter]
    spelled = " ".join(word)
    question = f"How many times does the letter '{letter}' appear in the word '{word}'?"
    answer = (
        f"Spelled out: {spelled}. The letter '{letter}' is at position(s) "
        f"{', '.join(map(str, positions))}.\n#### {len(positions)}"
    )
    return question, answer


def _tally(rng: random.Random) -> Task:
    fruit = rng.choice(FRUITS)
    basket = [rng.choice(FRUITS) for _ in range(rng.randint(4, 14))]
    count = basket.count(fruit)
    running = []
    seen = 0
    for item in basket:
        seen += item == fruit
        running.append(f"{item} ({seen})" if item == fruit else item)
    question = f"Count the {fruit}s in this list: {', '.join(basket)}."
    answer = f"Going through the list: {', '.join(running)}.\n#### {count}"
    return question, answer


def _sequence(rng: random.Random) -> Task:
    start, step, n = rng.randint(0, 60), rng.randint(1, 9), rng.randint(4, 10)
    values = [start + step * i for i in range(n)]
    question = f"Count from {start} in steps of {step}, giving {n} numbers."
    return question, f"{', '.join(map(str, values))}\n#### {values[-1]}"


def _mod(rng: random.Random) -> Task:
    m = rng.randint(2, 30)
    a = rng.randint(m, 2000)
    q, r = divmod(a, m)
    question = f"What is {a} mod {m}?"
    return question, f"{a} = {m} * {q} + {r}, so {a} mod {m} = {r}.\n#### {r}"


def _clock(rng: random.Random) -> Task:
    hour, later = rng.randint(1, 12), rng.randint(1, 100)
    result = (hour - 1 + later) % 12 + 1
    question = f"It is {hour} o'clock. What time will it be {later} hours later on a 12-hour clock?"
    answer = (
        f"{later} mod 12 = {later % 12}, and moving {later % 12} hours on from {hour} o'clock "
        f"gives {result} o'clock.\n#### {result}"
    )
    return question, answer


def _weekday(rng: random.Random) -> Task:
    day, later = rng.randrange(7), rng.randint(1, 400)
    result = DAYS[(day + later) % 7]
    question = f"Today is {DAYS[day]}. What day of the week will it be in {later} days?"
    answer = (
        f"{later} mod 7 = {later % 7}, and {later % 7} days after {DAYS[day]} is {result}.\n"
        f"#### {result}"
    )
    return question, answer


COUNTING: tuple[Callable[[random.Random], Task], ...] = (_letters, _tally, _sequence)
MODULAR: tuple[Callable[[random.Random], Task], ...] = (_mod, _clock, _weekday)
