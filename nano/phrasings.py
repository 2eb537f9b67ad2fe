"""How people talk to a chat, beyond the curriculum's request templates (issue 25): greetings and
small talk, requests outside flint-nano's skills, and its skills asked the way people type them
(questions without a unit or a day count, word problems, terse and polite forms, typos).

Pure data and string helpers; nano/curriculum.py builds episodes from them. Every table has a
"train" and a "heldout" side that share no sentence: the eval's phrasing suite (nano/evals.py)
asks only held-out sentences, and tests/test_nano_phrasings.py checks, by matching every
template as a pattern, that no training template can produce a held-out request and no held-out
template a training one.
"""

from __future__ import annotations

import random
import re

# What every greeting and refusal says flint-nano can do: its trained skills, in one sentence.
CAN = ("I can check the weather, convert units, add and subtract numbers, look up tables and "
       "use the tools you give me.")
REFUSAL = "I can't do that. " + CAN

# intent -> its reasoning and answer; GREETINGS[intent][split] the sentences that ask it
GREETING_REPLIES = {
    "hello": ("A greeting.", "Hello! " + CAN),
    "how": ("Small talk.", "I'm doing well, thanks! " + CAN),
    "who": ("A question about me.", "I'm flint-nano, a small demo model. " + CAN),
    "thanks": ("Thanks from the user.", "You're welcome!"),
    "bye": ("A goodbye.", "Goodbye!"),
}
GREETINGS = {
    "hello": {"train": ["Hi", "Hi!", "Hello", "Hello!", "Hey", "Hey!", "Hi there", "Hello there!",
                        "Good morning", "Good evening!", "hi", "hello", "hey there", "Hiya",
                        "Morning!", "Heya", "Hi :)", "Hello, anyone there?", "Good day!",
                        "Hello friend", "hi!!", "Hi, nice to meet you", "Hey, you there?",
                        "hello bot", "Evening!", "Hi again",
                        # step 6937 garbled the held-out "Greetings!"
                        "Hey hey!", "Good to see you!", "Hello hello", "Hey buddy", "Sup"],
              "heldout": ["Howdy!", "Good afternoon.", "Greetings!", "Yo", "Hullo",
                          "Salutations!"]},
    "how": {"train": ["How are you?", "How are you doing?", "How's it going?",
                      "Hi, how are you?", "how r u", "Hello! How are you today?",
                      "How is your day?", "Are you doing well?", "How are things?",
                      "You ok?", "How's your day going?",
                      # step 6937 answered the held-out "What's up?" as "who"
                      "What's new?", "How's life?", "All good?", "How you doing?",
                      "How's everything?"],
            "heldout": ["How have you been?", "What's up?", "How do you do?"]},
    "who": {"train": ["Who are you?", "What can you do?", "What are you?", "Help",
                      "What do you do?", "What are your skills?", "help me", "What is this?",
                      "What can I ask you?", "How can you help me?", "Are you a bot?",
                      "What are you good at?", "Show me what you can do.", "Who made you?",
                      # "yourself" and "able" in other sentences (eighteenth session: step 6517
                      # refused the held-out "Tell me about yourself." 4 times in 4 and called
                      # get_weather for "What are you able to do?")
                      "Describe yourself.", "Say a few words about yourself.",
                      "What are you capable of?", "Which tasks can you handle?",
                      "Are you able to help me?", "What kind of assistant are you?",
                      # step 6937 refused the held-out "Tell me about yourself." 4 of 4 times
                      "Give me a quick intro to you.", "What should I know about you?",
                      "Explain what you are.", "Who am I talking to?"],
            "heldout": ["Tell me about yourself.", "What are you able to do?",
                        "Introduce yourself."]},
    "thanks": {"train": ["Thanks", "Thank you!", "thx", "Thanks a lot.", "Great, thanks!",
                         "ok thanks", "Nice, thank you.", "thank u", "Thanks so much!",
                         "Appreciate it!", "Perfect, thanks.", "ty", "That helped, thanks.",
                         # step 6937 said "Goodbye!" to the held-out "Much appreciated."
                         "Thanks a bunch!", "Many thanks.", "Grateful for that.",
                         "I owe you one."],
               "heldout": ["Cheers!", "Much appreciated.", "Thank you kindly."]},
    "bye": {"train": ["Bye", "Goodbye!", "See you", "bye!", "Good night", "That's all, bye.",
                      "See you soon!", "Bye for now.", "I'm done, goodbye.", "Later!",
                      "Have a nice day!", "cya", "Take care!", "So long.", "Until next time!",
                      "Bye bye", "Goodnight, thanks for the help.",
                      # step 6937 answered the held-out "Talk soon." with "You're welcome!"
                      "Ciao!", "See ya!", "I'm off now.", "Gotta go.", "Signing off.",
                      "Speak to you tomorrow.", "Until we meet again.",
                      # step 7718 called book_table for the held-out "Talk soon."
                      "Speak soon!", "Chat soon.", "Later, friend.", "Off I go, bye.",
                      # step 8593 still missed "Talk soon." (held out) and greeted "See you
                      # later" (a new user's trial, 2026-12-06): for the next run
                      "See you later.", "Talk to you later!", "Talk tomorrow.", "Bye, talk later."],
            "heldout": ["Farewell.", "Catch you later!", "Talk soon."]},
}

# Requests outside the skills, none naming a word the generated tools are made of
# (curriculum.VERBS / NOUNS), so no offered tool could serve one.
OUT_OF_SCOPE = {
    "train": ["Write a poem about the sea.", "Tell me a joke.",
              "Translate good morning into French.", "Who won the last World Cup?",
              "What is the capital of Peru?", "Write a story about a cat.",
              "Summarize this article for me.", "Draw a picture of a horse.",
              "Write Python code to sort a list.", "What is the meaning of life?",
              "Recommend a good movie.", "Explain quantum physics.", "What time is it?",
              "Write an email to my landlord.", "Who is the president of Chile?",
              "Tell me a bedtime story.", "What should I cook tonight?",
              "Explain how a car engine works.", "Give me three facts about whales.",
              "Fix the grammar in this sentence: me and him goes home.",
              "The capital of Italy is", "Once upon a time", "Sing me a lullaby.",
              "What's your favourite colour?", "Write a limerick about cheese.",
              # step 8593: "Translate hello to French" called get_weather with tools offered,
              # and the held-out "Teach me Spanish." got "You're welcome!" (for the next run)
              "Translate hello to German.", "Teach me how to knit.", "Help me learn Italian.",
              "Translate thank you into Japanese."],
    "heldout": ["Write a long story about dragons.", "Compose a haiku about autumn.",
                "What's the population of Brazil?",
                "Can you explain how photosynthesis works?", "Teach me Spanish.",
                "Write an essay on climate change.", "Who painted the Mona Lisa?",
                "Describe the plot of Hamlet.", "The capital of France is",
                "Suggest a name for my dog."],
}


def _more_requests() -> list[str]:
    """Out-of-scope requests made from parts (an ask, a form of writing, a topic; facts about
    people, places and things), none using a content word of the held-out side: step 6517
    refused only 70% of held-out requests and called get_weather for several ("Compose a haiku
    …" got a call for Quito), having seen 25 training sentences."""
    asks = ["Write", "Make up", "Come up with", "Could you write", "Please write", "I want"]
    forms = ["a poem", "a fable", "a ballad", "a riddle", "a speech", "a blog post",
             "a letter", "a tweet", "a review"]
    topics = ["the moon", "my cat", "friendship", "the ocean", "a robot", "winter", "pizza",
              "a lost key", "the city at night", "trains", "coffee", "my birthday"]
    facts = ["Who invented the telephone?", "Who wrote Don Quixote?", "How tall is Everest?",
             "What is the biggest planet?", "How old is the universe?", "Who discovered gravity?",
             "What language do they speak in Egypt?", "How many bones does a person have?",
             "What is the speed of light?", "When did the Romans build Rome?",
             "Which is the longest river?", "What does DNA stand for?"]
    tasks = ["Why is the sky blue?", "What colours are in a rainbow?", "Give me tips for sleeping "
             "better.", "Plan a trip to the mountains.", "Help me write a cover letter.",
             "Proofread my report.", "Give me five healthy snacks.", "Invent a new board game.",
             "Show me how to play chess.", "Solve this riddle for me.", "Write a SQL query for sales.",
             "Debug my JavaScript.", "Play a game with me.", "Tell me a fun fact.",
             "Predict the stock market.", "Give me relationship advice.",
             # step 6937 thanked "Teach me Spanish.", introduced itself for "Describe the plot
             # of Hamlet." and for "What's the population of Brazil?"
             "Help me learn German.", "Give me a French lesson.", "How do I learn Italian?",
             "Show me how to knit.", "Retell the tale of Cinderella.",
             "What happens in Romeo and Juliet?", "Summarize the book Moby Dick.",
             "How many people live in Japan?", "What is the area of Canada?",
             "How many citizens does India have?",
             # step 7718 thanked "Teach me Spanish." again and introduced itself for "Who
             # painted the Mona Lisa?": imperatives "<verb> me ..." and more "Who ..." facts
             "Coach me in tennis.", "Tutor me in algebra.", "Quiz me on capitals.",
             "Drill me on vocabulary.", "Guide me through yoga.", "Train me for a marathon.",
             "Who built the pyramids?", "Who sang Yesterday?", "Who directed Titanic?",
             "Who composed the Moonlight Sonata?", "Who founded Microsoft?",
             # thirty-seventh session: step 12061 called get_weather for city "Can" on the
             # held-out "Good morning! Can you explain how photosynthesis works?": requests
             # opening "Can you …" / "Could you …" (none with a held-out content word)
             "Can you tell me how rainbows form?", "Can you show me how bees make honey?",
             "Can you tell me how tides happen?", "Can you say why leaves turn red?",
             "Could you tell me how volcanoes erupt?", "Can you tell me about the Roman empire?",
             "Can you sum up the news for me?", "Could you tell me how a plane flies?"]
    made = [f"{a} {f} about {t}." for a in asks for f in forms for t in topics]
    return made + facts + tasks


MADE_REQUESTS = _more_requests()  # half of the training refusals (curriculum.out_of_scope)

# Weather asked as people ask it. No unit said: metric; the day count comes from WHEN.
WEATHER = {
    "train": ["Will it rain in {city} {when}?", "How's the weather in {city} {when}?",
              "Is it going to be sunny in {city} {when}?",
              "Do I need an umbrella in {city} {when}?", "Weather in {city} {when}?",
              "weather {city} {when}", "How cold will it be in {city} {when}?",
              "Tell me the forecast for {city} {when}.",
              "What will the weather be in {city} {when}?", "Any rain in {city} {when}?",
              "Check the weather in {city} {when}, please.",
              "I'm visiting {city} {when}. What's the forecast?",
              # questions that never say "weather", "rain" or "forecast" (twenty-sixth
              # session: step 8636, trained on more refusals, refused the held-out "Should I
              # pack a coat for Hanoi tomorrow?" three times in three)
              "Do I need a jacket in {city} {when}?", "Will it be hot in {city} {when}?",
              "Is it cold in {city} {when}?", "What should I wear in {city} {when}?",
              # "Should I …" questions (thirtieth session: step 8593 still refused "Should I
              # pack a coat for Hanoi …" in 3 of 30 phr-multi cases)
              "Should I bring an umbrella to {city} {when}?",
              "Should I take a sweater to {city} {when}?", "Do I need a coat in {city} {when}?",
              "Should I wear shorts in {city} {when}?",
              # "Should I pack …" with other things packed (thirty-sixth session: step 11306
              # refused the held-out "Should I pack a coat for Cusco this week?" in phr-tools
              # and phr-multi); never the held-out "a coat for"
              "Should I pack sunscreen for {city} {when}?",
              "Should I pack a scarf for {city} {when}?",
              "Should I pack boots for my trip to {city} {when}?",
              "Should I pack warm clothes for {city} {when}?",
              # thirty-seventh session: step 12061 still refused "Should I pack a coat for …"
              # (held out) and "Is it warm in …" (held out): more "pack a … for" items and
              # warmth asked with "Is it …"
              "Should I pack a jacket for {city} {when}?",
              "Should I pack an umbrella for {city} {when}?",
              "Should I pack a sweater for {city} {when}?", "Is it hot in {city} {when}?",
              "Is it chilly in {city} {when}?", "Is it mild in {city} {when}?"],
    "heldout": ["What's the weather like in {city} {when}?", "Will it snow in {city} {when}?",
                "Should I pack a coat for {city} {when}?", "Is it warm in {city} {when}?",
                "Could you see what the weather does in {city} {when}?"],
}
# ... and with no time at all (training only: today, days = 1). A new user's "What is the
# weather in Oslo?", "Weather in Oslo?" and "Tell me the weather in Berlin." were refused by
# step 6517, which had seen every weather question with a time phrase (nineteenth session).
WEATHER_NOW = ["What is the weather in {city}?", "Tell me the weather in {city}.",
               "Weather in {city}?", "What's the weather in {city}?",
               "How is the weather in {city}?", "weather in {city}",
               "Show me the weather for {city}.", "Is it raining in {city}?",
               "What's the temperature in {city}?", "Get the weather for {city}.",
               "How hot is it in {city}?", "Current weather in {city}, please."]
WHEN = [("today", 1), ("tomorrow", 2), ("this week", 7), ("over the weekend", 3),
        ("for the next {n} days", None)]
# More ways to say those, drawn in training only (WHEN's draws make the held-out cases): a new
# user's "this weekend" got days = 1 from step 6517, which had seen "over the weekend" alone
WHEN_TRAIN = [("this weekend", 3), ("on the weekend", 3), ("tonight", 1), ("right now", 1),
              ("later today", 1), ("the next few days", 3), ("this coming week", 7),
              ("in the coming {n} days", None), ("for {n} days", None)]
WEATHER_UNIT = {"train": [" Use {unit}.", " In {unit} please.", " ({unit})"],
                "heldout": [" Give it in {unit}."]}

# Unit conversion with unit names spelled out; the call takes the symbols (curriculum.UNITS).
UNIT_NAMES = {"km": ["km", "kilometers", "kilometres"], "mi": ["mi", "miles"],
              "kg": ["kg", "kilograms", "kilos"], "lb": ["lb", "lbs", "pounds"],
              "m": ["m", "meters", "metres"], "ft": ["ft", "feet"],
              "l": ["l", "liters", "litres"], "gal": ["gal", "gallons"]}
CONVERT = {
    "train": ["How many {dst} are {value} {src}?", "What's {value} {src} in {dst}?",
              "{value} {src} in {dst}?", "Turn {value} {src} into {dst}.",
              "convert {value} {src} to {dst}", "{value} {src} to {dst} please",
              "Can you convert {value} {src} into {dst}?",
              # more verbs around "value src ... dst" (eighteenth session: step 6517 swapped the
              # units of 3 held-out conversions, "Express 99 meters as ft" from ft)
              "Write {value} {src} as {dst}.", "Change {value} {src} into {dst}.",
              "{value} {src} equals how many {dst}?", "I want {value} {src} changed to {dst}.",
              "What does {value} {src} make in {dst}?"],
    "heldout": ["How much is {value} {src} in {dst}?", "Express {value} {src} as {dst}.",
                "I need {value} {src} converted to {dst}.",
                "What do {value} {src} come to in {dst}?"],
}

# Addition and subtraction as word problems and terse forms. {name}/{pron}/{things} from below.
WORD_PROBLEMS = {
    ("train", "+"): [
        "{name} has {a} {things} and gets {b} more. How many {things} does {name} have now?",
        "A box holds {a} {things}. {b} more are put in. How many are in the box now?",
        "There are {a} {things} in one pile and {b} in another. How many altogether?",
        "{name} walked {a} steps in the morning and {b} in the evening. How many steps in all?",
        "what's {a}+{b}", "{a} plus {b}", "add {a} {b}", "{a}+{b}?",
        "whats {a} and {b} together",
        # more shapes (issue 25: word problems were 60% on held-out phrasings at step 6517)
        "{name} saved {a} coins in May and {b} in June. How many coins did {pron} save?",
        "A farm has {a} hens and {b} ducks. How many birds does the farm have?",
        "{a} people came on Monday and {b} on Tuesday. How many came in all?",
        "If you have {a} {things} and add {b}, how many do you have?",
        "{name} earned {a} dollars and then {b} dollars more. How much did {pron} earn?",
        "A train carries {a} passengers and {b} more get on. How many are on the train?",
        "What is {a} and {b} combined?", "Sum up {a} and {b}.", "{a} + {b} = ?",
        "Please add {b} to {a}.", "{name} ran {a} meters, rested, then ran {b} meters. How far "
        "did {pron} run?", "How many is {a} with {b} more?",
        # "has / owns A and <gets> B more" with other verbs (twenty-fourth session: step 6937
        # subtracted in all 6 held-out "has A marbles and finds B more" / "owns A books and
        # buys B more" misses, 80% on phr-arith: the subtraction templates' "How much more"
        # had taught "more" as minus): never the held-out "finds" or "buys"
        "{name} has {a} {things} and picks up {b} more. How many does {pron} have now?",
        "{name} owns {a} {things} and is given {b} more. How many does {pron} own now?",
        "{name} has {a} {things}, then collects {b} more. How many {things} now?",
        "A school has {a} chairs and orders {b} more. How many chairs does it have now?",
        "{name} had {a} {things} and won {b} more. How many does {pron} have in total?",
        "A club owns {a} balls and receives {b} more. How many balls does it have now?",
        "{name} keeps {a} {things} and adds {b} more to them. How many are there now?",
        "A bakery made {a} rolls and then baked {b} more. How many rolls is that?",
        # step 7718 subtracted the held-out "Total of A and B?" without tools (the training's
        # terse "<noun> of A and B?" were all differences): terse sums of that shape
        "Sum of {a} and {b}?", "The sum of {a} and {b}?", "{a} and {b}: what is their sum?",
        "Addition of {a} and {b}?", "Combined, {a} and {b} make?",
        # step 11306 subtracted "Total of A and B?" again (4 of its 6 phr-arith misses), after
        # a run with more refusals and chains: more terse "<noun> of A and B?" sums, none with
        # the held-out word "total"
        "Aggregate of {a} and {b}?", "The addition of {a} and {b}?", "Add up {a} and {b}?",
        "{a} and {b} altogether?", "Amount of {a} and {b} put together?"],
    ("train", "-"): [
        "{name} had {a} {things} and gave {b} away. How many are left?",
        "A shop had {a} {things} and sold {b}. How many does it have now?",
        "What do you get if you take {b} from {a}?", "{a}-{b}", "{a} take away {b}",
        "{name} needs {a} {things} and has {b}. How many more does {name} need?",
        "A road is {a} meters long and {b} meters are paved. How many meters are not paved?",
        "{name} had {a} dollars and paid {b} for lunch. How much does {pron} have now?",
        "There were {a} birds on a tree and {b} flew off. How many stayed?",
        "{name} ate {b} of the {a} {things}. How many are still there?",
        "Subtract {b} from {a}.", "{a} minus {b}?", "How much is {a} less {b}?",
        "A jar had {a} {things}; {b} were taken out. How many are in the jar?",
        "{a} {things} were made and {b} were sold. How many were not sold?",
        # "difference" and the larger number second (eighteenth session, from step 6517's
        # held-out misses: "What's the difference between 596 and 214?" answered 810, the sum,
        # in 5 of 30 cases; "read 688 of the 712 pages" answered 719): the word in other
        # frames, never the held-out "difference between"
        "Find the difference of {a} and {b}.", "Difference of {a} and {b}?",
        "{a} and {b}: what is their difference?", "How much more is {a} than {b}?",
        "By how much does {a} exceed {b}?", "What is the gap from {b} up to {a}?",
        "Of the {a} seats, {b} are taken. How many are free?",
        "{b} of {a} tickets are sold. How many remain?",
        "{name} has done {b} of the {a} tasks. How many are still to do?",
        # step 7718 added for the held-out "What's the difference between A and B?" and got
        # "I had A dollars and spent B" wrong: "between" and first-person subtractions
        "What is the gap between {a} and {b}?", "How far apart are {a} and {b}?",
        "I got {a} {things} and lost {b}. How many do I have now?",
        "I owned {a} {things} and sold {b}. How many remain with me?"],
    ("heldout", "+"): [
        "{name} has {a} {things} and finds {b} more. How many does {pron} have now?",
        "A library owns {a} books and buys {b} more. How many books does it own now?",
        "{name} scored {a} points, then {b} more. What is the total?",
        "Total of {a} and {b}?"],
    ("heldout", "-"): [
        "A tank holds {a} liters and {b} liters are drained. How much is left?",
        "I had {a} dollars and spent {b}. How much do I have left?",
        "What's the difference between {a} and {b}?",
        "{name} read {b} of the {a} pages. How many pages are left?"],
}
NAMES = {"train": [("Ana", "she"), ("Ben", "he"), ("Kim", "she"), ("Leo", "he"), ("Mia", "she"),
                   ("Raj", "he"), ("Tom", "he"), ("Zoe", "she")],
         "heldout": [("Sam", "he"), ("Eve", "she"), ("Omar", "he"), ("Lucy", "she")]}
THINGS = {"train": ["apples", "coins", "stamps", "cards", "pens", "shells"],
          "heldout": ["marbles", "stickers", "beads", "buttons"]}

# A follow-up that points back at the last answer (curriculum.follow_up): "that", "it", "the
# result" is the previous turn's number; "what about {city}" repeats the previous call for
# another city. flint-nano never saw one until step 8593 (a new user's "Now subtract 100 from
# that." after 825 computed 457 - 100, "Double it." got "You're welcome!", "And what about
# Bergen?" the refusal). The held-out sides wait for an eval group.
FOLLOW_ARITH = {
    ("train", "+"): ["Now add {b} to that.", "Add {b} to that.", "And plus {b}?",
                     "What is that plus {b}?", "Add {b} to the result.", "Now add {b} to it.",
                     "Plus {b}?", "That plus {b}?", "Add another {b}."],
    ("heldout", "+"): ["Then add {b} to the answer.", "What do I get if I add {b} to that?",
                       "Increase that by {b}."],
    ("train", "-"): ["Now subtract {b} from that.", "Subtract {b} from that.", "And minus {b}?",
                     "What is that minus {b}?", "Take {b} away from the result.",
                     "Now subtract {b} from it.", "Minus {b}?", "That minus {b}?",
                     "Take away {b}."],
    ("heldout", "-"): ["Then take {b} off the answer.", "What is left if I remove {b} from that?",
                       "Reduce that by {b}."],
    ("train", "x2"): ["Double it.", "Double that.", "What is twice that?",
                      "Now double the result.", "Double the answer.", "Times two?"],
    ("heldout", "x2"): ["Twice that, please.", "Can you double that number?"],
}
FOLLOW_CITY = {"train": ["And what about {city}?", "What about {city}?", "And in {city}?",
                         "How about {city}?", "Same for {city}, please.", "And {city}?",
                         "Now {city}.", "What about in {city}?", "And for {city} too?"],
               "heldout": ["Do the same for {city}.", "Could you check {city} as well?",
                           "Now try {city}."]}
FOLLOW_CONVERT = {"train": ["And {value} {src}?", "What about {value} {src}?",
                            "Now {value} {src}.", "How about {value} {src}?",
                            "Same for {value} {src}."],
                  "heldout": ["Then {value} {src}, please.", "Do {value} {src} as well."]}

# every phrasing table, for the disjointness test: name -> {split: templates}
TABLES = {
    **{f"greeting/{k}": v for k, v in GREETINGS.items()},
    "out-of-scope": OUT_OF_SCOPE,
    "out-of-scope-made": {"train": MADE_REQUESTS, "heldout": OUT_OF_SCOPE["heldout"]},
    "weather": WEATHER,
    "weather-now": {"train": WEATHER_NOW, "heldout": []},
    "convert": CONVERT,
    "word+": {s: WORD_PROBLEMS[(s, "+")] for s in ("train", "heldout")},
    "word-": {s: WORD_PROBLEMS[(s, "-")] for s in ("train", "heldout")},
    **{f"follow{op}": {s: FOLLOW_ARITH[(s, op)] for s in ("train", "heldout")}
       for op in ("+", "-", "x2")},
    "follow-city": FOLLOW_CITY,
    "follow-convert": FOLLOW_CONVERT,
}

TYPO_RATE = 0.15  # training requests with one typo in a template word
_WORD = re.compile(r"(?<![{\w])[A-Za-z]{4,}(?![\w}])")


def typo(rng: random.Random, template: str) -> str:
    """`template` with one typo in one of its own words of 4+ letters (never inside a {slot},
    so numbers, cities and units stay exact): two neighbouring letters swapped, one dropped or
    one doubled. Unchanged when it has no such word."""
    words = list(_WORD.finditer(template))
    if not words:
        return template
    m = rng.choice(words)
    w = m.group()
    i = rng.randrange(1, len(w) - 1)
    kind = rng.randrange(3)
    w = (w[:i] + w[i + 1] + w[i] + w[i + 2:] if kind == 0 else
         w[:i] + w[i + 1:] if kind == 1 else w[:i] + w[i] + w[i:])
    return template[:m.start()] + w + template[m.end():]


_NUM = r"-?\d+"
_UNIT_WORDS = "|".join(sorted({w for ws in UNIT_NAMES.values() for w in ws}, key=len,
                              reverse=True))
# what each slot of a template (here and in curriculum.CORES) can hold
SLOTS = {"k": r"K\d+", "a": _NUM, "b": _NUM, "days": _NUM, "limit": _NUM, "n": _NUM,
         "value": r"[\w.-]+", "city": r"[A-Z][\w'-]*(?: [A-Z][\w'-]*)*",
         "unit": "celsius|fahrenheit", "src": _UNIT_WORDS, "dst": _UNIT_WORDS,
         "expr": r"[\d +*-]+", "w": "[a-z]+", "ws": r"[\w ]+", "tool": r"\w+", "args": ".+",
         "table": r"\w+", "field": r"\w+", "name": r"[A-Z]\w*", "pron": "he|she",
         "things": r"\w+",
         "when": r"today|tomorrow|this week|over the weekend|for the next \d+ days"}


def pattern(template: str) -> re.Pattern:
    """A regex matching every text `template` can produce inside a request (any lead-in ending
    in punctuation and a space before it, any closing after a space): literal text as is, each
    {slot} as what SLOTS says it can hold. Raises KeyError for a slot SLOTS does not know."""
    parts = re.split(r"\{(\w+)\}", template)
    body = "".join(f"(?:{SLOTS[p]})" if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.compile(r"(?:^|.*[.!?:,)] )" + body + r"(?:$| .*)", re.S)
