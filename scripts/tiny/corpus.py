#!/usr/bin/env python3
"""Synthetic harmony conversations for the tiny gpt-oss target (standard library only).

    corpus.py [--seed N] [--count N] [--show N]     print N rendered examples as plain text

Every conversation is a templated task with a worked answer: arithmetic in columns, counting
letters, spelling backwards, sorting, unit conversions, number sequences, word categories and a
few more. Each assistant turn has an analysis message (the working, whose length depends on the
reasoning effort: low = one line, medium = the steps, high = the steps and a check) and a final
message (the answer). About a quarter of the conversations have a second user turn.

The generator is deterministic: conversation i of seed s depends only on (s, i), so the training
set and the held-out sample conversations never overlap when they use different seeds, and a
longer corpus starts with the same conversations as a shorter one. The word lists below were
written for this project and carry its license.
"""

import argparse
import random
import sys

EFFORTS = ("low", "medium", "high")

# Common English words, 3 to 10 letters.
WORDS = """
apple river garden window planet silver orange market winter summer bridge candle forest
pencil rocket castle dragon island jacket ladder mirror needle pillow rabbit saddle tunnel
violin walnut yellow zebra anchor basket butter carpet cherry doctor engine farmer guitar
hammer helmet insect jungle kitten lemon magnet napkin office parrot pepper puzzle quarter
rainbow shadow spider teacher turtle valley wallet whistle wizard blanket cactus diamond
feather giraffe harbor kettle lantern meadow nectar oyster pirate quilt ribbon saucer thunder
unicorn velvet wagon yogurt bottle button cookie donkey eagle falcon goblin honey igloo jelly
koala lizard mango noodle otter panda quiver raven salmon tiger umbrella vessel walrus banana
circle little happy simple bright gentle quiet strong yellow purple silent clever golden
hollow narrow modest steady swift brave calm eager fancy jolly lucky merry proud witty
school letter number people family story paper water music money moment travel picture
morning evening country mountain ocean desert city village street corner station library
kitchen bedroom hallway balcony chimney cellar attic garage stairs roof floor table chair
spoon fork plate glass bowl knife stove oven sink towel brush comb soap shelf drawer
cotton wool leather metal stone wooden copper bronze marble crystal plastic rubber
""".split()

CATEGORIES = {
    "fruit": "apple banana cherry mango lemon orange grape peach pear plum melon kiwi".split(),
    "animal": "zebra tiger panda koala otter rabbit donkey giraffe walrus lizard parrot eagle "
              "falcon raven turtle spider".split(),
    "color": "red blue green yellow purple orange pink brown black white gray violet".split(),
    "vehicle": "car bus train truck bicycle boat plane rocket wagon tram scooter ship".split(),
    "tool": "hammer saw drill wrench shovel rake ladder chisel pliers needle".split(),
    "instrument": "violin guitar piano flute drum trumpet harp cello banjo whistle".split(),
}

UNITS = [  # (from, to, factor, singular from, singular to)
    ("kilometers", "meters", 1000, "kilometer", "meter"),
    ("meters", "centimeters", 100, "meter", "centimeter"),
    ("hours", "minutes", 60, "hour", "minute"),
    ("minutes", "seconds", 60, "minute", "second"),
    ("days", "hours", 24, "day", "hour"),
    ("weeks", "days", 7, "week", "day"),
    ("kilograms", "grams", 1000, "kilogram", "gram"),
    ("dozens", "items", 12, "dozen", "item"),
    ("years", "months", 12, "year", "month"),
    ("liters", "milliliters", 1000, "liter", "milliliter"),
]

DIGIT_NAMES = ["ones", "tens", "hundreds", "thousands"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]
VOWELS = "aeiou"


def pick(r, options):
    return options[r.randrange(len(options))]


def opener(r, what):
    return pick(r, ["We need to %s." % what, "The user asks us to %s." % what,
                    "The task: %s." % what, "User wants to %s." % what])


def spelled(word, sep="-"):
    return sep.join(word)


def plural(n, one, many):
    return "%d %s" % (n, one if n == 1 else many)


# ---------------------------------------------------------------------------------------------
# Tasks. Each returns (user text, analysis per effort as a dict, final text).


def task_add(r):
    a, b = r.randint(10, 999), r.randint(10, 999)
    s = a + b
    user = pick(r, ["What is %d + %d?", "Add %d and %d.", "Compute %d plus %d.",
                    "Can you add %d and %d for me?", "%d + %d = ?",
                    "What do you get when you add %d to %d?"]) % (a, b)
    steps, carry = [], 0
    da, db = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        t = x + y + carry
        line = "%s: %d + %d" % (DIGIT_NAMES[i].capitalize(), x, y)
        if carry:
            line += " + %d" % carry
        line += " = %d" % t
        carry = t // 10
        line += ", write %d, carry %d." % (t % 10, carry) if carry else ", write %d." % t
        steps.append(line)
    if carry:
        steps.append("Write the final carry %d." % carry)
    head = opener(r, "add %d and %d" % (a, b))
    med = " ".join([head, "Add column by column."] + steps + ["So %d + %d = %d." % (a, b, s)])
    high = med + " Check: %d - %d = %d, which matches. The answer is %d." % (s, b, a, s)
    low = "%d + %d = %d." % (a, b, s)
    final = pick(r, ["%d + %d = %d." % (a, b, s), "The sum is %d." % s,
                     "%d plus %d equals %d." % (a, b, s), "**%d**" % s])
    return user, {"low": low, "medium": med, "high": high}, final


def task_sub(r):
    a = r.randint(20, 999)
    b = r.randint(1, a - 1)
    d = a - b
    user = pick(r, ["What is %d - %d?", "Subtract %d from %d.", "Compute %d minus %d.",
                    "%d - %d = ?", "How much is %d take away %d?"])
    user = user % ((b, a) if user.startswith("Subtract") else (a, b))
    head = opener(r, "subtract %d from %d" % (b, a))
    tens = (b // 10) * 10
    ones = b % 10
    steps = ["Split %d into %d and %d." % (b, tens, ones) if tens and ones else
             "Take %d away in one go." % b]
    if tens and ones:
        steps.append("%d - %d = %d." % (a, tens, a - tens))
        steps.append("%d - %d = %d." % (a - tens, ones, d))
    else:
        steps.append("%d - %d = %d." % (a, b, d))
    med = " ".join([head] + steps + ["So %d - %d = %d." % (a, b, d)])
    high = med + " Check: %d + %d = %d, correct. Answer: %d." % (d, b, a, d)
    low = "%d - %d = %d." % (a, b, d)
    final = pick(r, ["%d - %d = %d." % (a, b, d), "The difference is %d." % d,
                     "%d minus %d is %d." % (a, b, d), "**%d**" % d])
    return user, {"low": low, "medium": med, "high": high}, final


def task_mul(r):
    a, b = r.randint(11, 99), r.randint(2, 9)
    p = a * b
    user = pick(r, ["What is %d times %d?", "Multiply %d by %d.", "Compute %d x %d.",
                    "What is %d * %d?", "Calculate the product of %d and %d."]) % (a, b)
    tens, ones = (a // 10) * 10, a % 10
    head = opener(r, "multiply %d by %d" % (a, b))
    steps = ["Split %d into %d and %d." % (a, tens, ones),
             "%d x %d = %d." % (tens, b, tens * b),
             "%d x %d = %d." % (ones, b, ones * b),
             "Add them: %d + %d = %d." % (tens * b, ones * b, p)]
    med = " ".join([head] + steps + ["So %d x %d = %d." % (a, b, p)])
    high = med + " Check: %d / %d = %d, correct. The product is %d." % (p, b, a, p)
    low = "%d x %d = %d." % (a, b, p)
    final = pick(r, ["%d x %d = %d." % (a, b, p), "The product is %d." % p,
                     "%d times %d equals %d." % (a, b, p), "**%d**" % p])
    return user, {"low": low, "medium": med, "high": high}, final


def task_count_letter(r):
    word = pick(r, WORDS)
    letter = pick(r, sorted(set(word))) if r.random() < 0.8 else pick(r, "abcdefghijklmnoprstuw")
    n = word.count(letter)
    user = pick(r, ['How many times does the letter "%s" appear in "%s"?',
                    'Count the letter %s in the word %s.',
                    'How many %s\'s are in "%s"?',
                    'In the word "%s", how many times does "%s" occur?'])
    user = user % ((word, letter) if user.startswith("In the word") else (letter, word))
    head = opener(r, 'count "%s" in "%s"' % (letter, word))
    marks = []
    for i, ch in enumerate(word):
        marks.append("%s%s" % (ch, " (yes)" if ch == letter else ""))
    med = " ".join([head, "Spell it: %s." % spelled(word),
                    "Go letter by letter: %s." % ", ".join(marks),
                    'So "%s" appears %s.' % (letter, plural(n, "time", "times"))])
    positions = [str(i + 1) for i, ch in enumerate(word) if ch == letter]
    high = med + (" Positions: %s. Total %d." % (", ".join(positions), n) if positions
                  else " No position matches. Total 0.")
    low = '"%s" in "%s": %d.' % (letter, word, n)
    final = pick(r, ['The letter "%s" appears %s in "%s".' % (letter, plural(n, "time", "times"),
                                                            word),
                     "%d." % n, 'There %s %s in "%s".' % ("is" if n == 1 else "are",
                                                        plural(n, letter, letter + "'s"), word)])
    return user, {"low": low, "medium": med, "high": high}, final


def task_reverse(r):
    word = pick(r, WORDS)
    rev = word[::-1]
    user = pick(r, ['Spell "%s" backwards.', "What is %s written in reverse?",
                    'Reverse the letters of "%s".', "Can you write the word %s backwards?"]) % word
    head = opener(r, 'reverse "%s"' % word)
    med = " ".join([head, "Letters: %s." % spelled(word),
                    "Read them from the end: %s." % spelled(rev),
                    'Joined: "%s".' % rev])
    high = med + ' It has %s, the same as "%s". Good.' % (plural(len(word), "letter", "letters"),
                                                          word)
    low = '"%s" reversed is "%s".' % (word, rev)
    final = pick(r, ['"%s" backwards is "%s".' % (word, rev), "%s" % rev,
                     'Reversed: **%s**' % rev])
    return user, {"low": low, "medium": med, "high": high}, final


def task_sort_numbers(r):
    nums = [r.randint(1, 99) for _ in range(r.randint(4, 6))]
    desc = r.random() < 0.3
    order = "descending" if desc else "ascending"
    shown = ", ".join(map(str, nums))
    user = pick(r, ["Sort these numbers in %s order: %s.", "Put %s in %s order.",
                    "Arrange the numbers %s from %s."])
    if user.startswith("Sort"):
        user = user % (order, shown)
    elif user.startswith("Put"):
        user = user % (shown, order)
    else:
        user = user % (shown, "largest to smallest" if desc else "smallest to largest")
    head = opener(r, "sort %s in %s order" % (shown, order))
    rest, out, steps = list(nums), [], []
    while rest:
        v = max(rest) if desc else min(rest)
        steps.append("%s is %d." % ("Largest" if desc else "Smallest", v) if len(rest) > 1
                     else "Last is %d." % v)
        rest.remove(v)
        out.append(v)
    res = ", ".join(map(str, out))
    med = " ".join([head] + steps + ["Result: %s." % res])
    high = med + " Check: %s numbers in, %s out. Done." % (len(nums), len(out))
    low = "%s order: %s." % (order.capitalize(), res)
    final = pick(r, ["%s." % res, "In %s order: %s." % (order, res), "Sorted: %s" % res])
    return user, {"low": low, "medium": med, "high": high}, final


def task_sort_words(r):
    words = r.sample(WORDS, r.randint(3, 5))
    shown = ", ".join(words)
    user = pick(r, ["Sort these words alphabetically: %s.", "Put in alphabetical order: %s.",
                    "Alphabetize: %s."]) % shown
    head = opener(r, "sort %s alphabetically" % shown)
    out = sorted(words)
    steps = ["%s starts with %s." % (w.capitalize(), w[0]) for w in words]
    med = " ".join([head] + steps + ["Alphabetical: %s." % ", ".join(out)])
    high = med + " Check: %s comes first and %s last." % (out[0], out[-1])
    low = "Alphabetical: %s." % ", ".join(out)
    final = pick(r, ["%s." % ", ".join(out), "In alphabetical order: %s." % ", ".join(out)])
    return user, {"low": low, "medium": med, "high": high}, final


def task_convert(r):
    src, dst, f, one_src, one_dst = pick(r, UNITS)
    n = r.randint(2, 40)
    v = n * f
    user = pick(r, ["How many %s are in %d %s?" % (dst, n, src),
                    "Convert %d %s to %s." % (n, src, dst),
                    "What is %d %s in %s?" % (n, src, dst)])
    head = opener(r, "convert %d %s to %s" % (n, src, dst))
    med = " ".join([head, "One %s is %d %s." % (one_src, f, dst),
                    "Multiply: %d x %d = %d." % (n, f, v),
                    "So %d %s = %d %s." % (n, src, v, dst)])
    high = med + " Check: %d / %d = %d %s. Correct." % (v, f, n, src)
    low = "%d x %d = %d %s." % (n, f, v, dst)
    final = pick(r, ["%d %s is %d %s." % (n, src, v, dst), "%d %s." % (v, dst),
                     "There are %d %s in %d %s." % (v, dst, n, src)])
    return user, {"low": low, "medium": med, "high": high}, final


def task_sequence(r):
    start, step = r.randint(1, 30), r.randint(2, 9)
    seq = [start + i * step for i in range(r.randint(4, 5))]
    nxt = seq[-1] + step
    shown = ", ".join(map(str, seq))
    user = pick(r, ["What comes next: %s, ...?", "Continue the sequence %s.",
                    "Find the next number in %s."]) % shown
    head = opener(r, "find the next number after %s" % shown)
    diffs = ["%d - %d = %d" % (seq[i + 1], seq[i], step) for i in range(len(seq) - 1)]
    med = " ".join([head, "Differences: %s." % "; ".join(diffs),
                    "The step is always %d." % step,
                    "Next: %d + %d = %d." % (seq[-1], step, nxt)])
    high = med + " The rule is: start at %d and add %d each time." % (start, step)
    low = "Step %d, next %d." % (step, nxt)
    final = pick(r, ["The next number is %d." % nxt, "%d" % nxt,
                     "%d (each term adds %d)." % (nxt, step)])
    return user, {"low": low, "medium": med, "high": high}, final


def task_category(r):
    cat = pick(r, sorted(CATEGORIES))
    others = [c for c in sorted(CATEGORIES) if c != cat]
    right = pick(r, CATEGORIES[cat])
    wrong = [pick(r, CATEGORIES[c]) for c in r.sample(others, 2)]
    items = [right] + [w for w in wrong if w != right]
    r.shuffle(items)
    shown = ", ".join(items)
    article = "an" if cat[0] in VOWELS else "a"
    user = pick(r, ["Which of these is %s %s: %s?" % (article, cat, shown),
                    "Pick the %s from this list: %s." % (cat, shown),
                    "Among %s, which one is %s %s?" % (shown, article, cat)])
    head = opener(r, "find the %s among %s" % (cat, shown))
    steps = []
    for it in items:
        kind = next(c for c in sorted(CATEGORIES) if it in CATEGORIES[c])
        steps.append("%s is %s %s." % (it.capitalize(), "an" if kind[0] in VOWELS else "a", kind))
    med = " ".join([head] + steps + ["So the %s is %s." % (cat, right)])
    high = med + " Only one item matches, so the answer is clear."
    low = "%s is %s %s." % (right.capitalize(), article, cat)
    final = pick(r, ["%s is %s %s." % (right.capitalize(), article, cat),
                     "The %s is %s." % (cat, right), "%s." % right.capitalize()])
    return user, {"low": low, "medium": med, "high": high}, final


def task_word_facts(r):
    word = pick(r, WORDS)
    kind = r.randrange(3)
    if kind == 0:
        n = len(word)
        user = pick(r, ['How many letters are in "%s"?', "How long is the word %s?",
                        "Count the letters in %s."]) % word
        head = opener(r, 'count the letters of "%s"' % word)
        numbered = ", ".join("%d %s" % (i + 1, ch) for i, ch in enumerate(word))
        med = " ".join([head, "Spell it: %s." % spelled(word), "Number them: %s." % numbered,
                        "So it has %d letters." % n])
        high = med + " The last letter is %s at position %d." % (word[-1], n)
        low = '"%s" has %d letters.' % (word, n)
        final = pick(r, ['"%s" has %d letters.' % (word, n), "%d letters." % n, "%d" % n])
    elif kind == 1:
        vs = [ch for ch in word if ch in VOWELS]
        n = len(vs)
        user = pick(r, ['How many vowels are in "%s"?', "Count the vowels in %s.",
                        "How many vowels does the word %s have?"]) % word
        head = opener(r, 'count the vowels in "%s"' % word)
        med = " ".join([head, "Vowels are a, e, i, o, u.", "Spell it: %s." % spelled(word),
                        "Vowels found: %s." % (", ".join(vs) if vs else "none"),
                        "That is %s." % plural(n, "vowel", "vowels")])
        high = med + " Consonants: %d of %d letters." % (len(word) - n, len(word))
        low = '"%s": %s.' % (word, plural(n, "vowel", "vowels"))
        final = pick(r, ['"%s" has %s.' % (word, plural(n, "vowel", "vowels")), "%d." % n])
    else:
        i = r.randrange(min(len(word), len(ORDINALS)))
        user = pick(r, ['What is the %s letter of "%s"?', "Which letter is %s in the word %s?"]) \
            % (ORDINALS[i], word)
        head = opener(r, 'find the %s letter of "%s"' % (ORDINALS[i], word))
        numbered = ", ".join("%d %s" % (j + 1, ch) for j, ch in enumerate(word[:i + 1]))
        med = " ".join([head, "Spell it: %s." % spelled(word), "Count: %s." % numbered,
                        "The %s letter is %s." % (ORDINALS[i], word[i])])
        high = med + " Position %d is %s." % (i + 1, word[i])
        low = "%s letter of %s: %s." % (ORDINALS[i].capitalize(), word, word[i])
        final = pick(r, ['The %s letter of "%s" is "%s".' % (ORDINALS[i], word, word[i]),
                         '"%s".' % word[i]])
    return user, {"low": low, "medium": med, "high": high}, final


def task_compare(r):
    a, b = r.sample(range(1, 1000), 2)
    user = pick(r, ["Which is larger, %d or %d?", "Is %d bigger than %d?",
                    "Compare %d and %d."]) % (a, b)
    big, small = max(a, b), min(a, b)
    head = opener(r, "compare %d and %d" % (a, b))
    la, lb = len(str(a)), len(str(b))
    if la != lb:
        why = "%d has %s and %d has %s." % (a, plural(la, "digit", "digits"), b,
                                           plural(lb, "digit", "digits"))
    else:
        why = "Both have %s; compare from the left." % plural(la, "digit", "digits")
    med = " ".join([head, why, "%d > %d." % (big, small), "Difference: %d - %d = %d." %
                    (big, small, big - small)])
    high = med + " So %d is the larger one." % big
    low = "%d > %d." % (big, small)
    if user.startswith("Is"):
        final = ("Yes, %d is bigger than %d." % (a, b)) if a > b else \
            ("No, %d is smaller than %d." % (a, b))
    else:
        final = pick(r, ["%d is larger." % big, "%d is larger than %d." % (big, small),
                         "**%d**" % big])
    return user, {"low": low, "medium": med, "high": high}, final


def task_parity(r):
    n = r.randint(2, 999)
    d = pick(r, [2, 3, 5, 10])
    user = pick(r, ["Is %d divisible by %d?", "Can %d be divided evenly by %d?",
                    "Does %d divide by %d with no remainder?"]) % (n, d)
    q, rem = divmod(n, d)
    head = opener(r, "check whether %d is divisible by %d" % (n, d))
    med = " ".join([head, "%d / %d = %d remainder %d." % (n, d, q, rem),
                    "The remainder is %s." % ("zero" if rem == 0 else "not zero")])
    high = med + " Check: %d x %d + %d = %d." % (q, d, rem, n)
    low = "%d = %d x %d + %d." % (n, d, q, rem)
    final = ("Yes, %d / %d = %d." % (n, d, q)) if rem == 0 else \
        ("No, %d / %d leaves a remainder of %d." % (n, d, rem))
    return user, {"low": low, "medium": med, "high": high}, final


def task_extreme(r):
    nums = [r.randint(1, 999) for _ in range(r.randint(4, 6))]
    want_max = r.random() < 0.5
    what = "largest" if want_max else "smallest"
    shown = ", ".join(map(str, nums))
    user = pick(r, ["What is the %s number in %s?", "Find the %s of %s.",
                    "Which is the %s: %s?"]) % (what, shown)
    head = opener(r, "find the %s of %s" % (what, shown))
    best, steps = nums[0], ["Start with %d." % nums[0]]
    for v in nums[1:]:
        better = v > best if want_max else v < best
        steps.append("%d %s %d, %s." % (v, ">" if v > best else ("<" if v < best else "="), best,
                                        "take %d" % v if better else "keep %d" % best))
        if better:
            best = v
    med = " ".join([head] + steps + ["The %s is %d." % (what, best)])
    high = med + " Checked all %d numbers." % len(nums)
    low = "%s: %d." % (what.capitalize(), best)
    final = pick(r, ["The %s number is %d." % (what, best), "%d." % best, "**%d**" % best])
    return user, {"low": low, "medium": med, "high": high}, final


TASKS = [task_add, task_sub, task_mul, task_count_letter, task_reverse, task_sort_numbers,
         task_sort_words, task_convert, task_sequence, task_category, task_word_facts,
         task_compare, task_parity, task_extreme]

FOLLOW_UPS = ["Thanks. %s", "Great. Next: %s", "Now another one. %s", "%s", "OK. %s"]


def conversation(seed, index):
    """Conversation `index` of the corpus with seed `seed`: a dict with the reasoning effort
    and one or two turns {user, analysis, final}; analysis is for that effort."""
    r = random.Random("%d/%d" % (seed, index))
    effort = pick(r, EFFORTS)
    turns = []
    n_turns = 2 if r.random() < 0.25 else 1
    for t in range(n_turns):
        user, analysis, final = pick(r, TASKS)(r)
        if t > 0:
            user = pick(r, FOLLOW_UPS) % user
        turns.append({"user": user, "analysis": analysis[effort], "final": final})
    return {"id": "tiny-%d-%06d" % (seed, index), "effort": effort, "turns": turns}


def corpus(seed, count, start=0):
    return [conversation(seed, i) for i in range(start, start + count)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=5)
    args = ap.parse_args()
    for c in corpus(args.seed, args.count):
        print("== %s (reasoning %s)" % (c["id"], c["effort"]))
        for t in c["turns"]:
            print("user: %s\nanalysis: %s\nfinal: %s" % (t["user"], t["analysis"], t["final"]))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
