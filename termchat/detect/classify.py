"""Is a prompt about code? -> which temperature to use.

Low temperature keeps speculation's acceptance rate high, and code wants it
anyway, so code prompts use the profile's `code_temperature`.

The detector generalizes instead of listing languages one by one:
- certain signs: a code fence; a file name whose extension a pygments lexer
  claims; lines that look like source;
- languages, tools and formats: every pygments lexer's name and aliases
  (plus a few tools pygments has no lexer for), weighed down when the name
  is also an ordinary word (python, java, rust, go, shell...);
- the shape of a programming request: a request verb before an artefact of
  code (write a function, crée une ressource, add a unit test...);
- programming vocabulary and identifiers (snake_case, camelCase, call(),
  KeyError), in English and French;
- creative genres (poem, story, chanson...) count against.
A score of 2 makes code. What the rules leave as text, the default model's
topic probe (topic_probe.py) may still call code: it knows that "a monad" or
"an inner join" is programming, which no word list keeps up with. `python -m termchat.bench.classify_eval` measures it
on a labelled set with a held-out part.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import cache

from pygments.lexers import get_all_lexers, guess_lexer
from pygments.util import ClassNotFound

from termchat.detect import topic_probe

# lexer aliases that are mostly ordinary words (English or French): not a sign
COMMON_WORDS = set(
    "text output email arrow art as at be berry bugs clay clean coffee do dot factor fancy fish flo forth gap gas icon io "
    "kid less limbo liquid logos make man mask mason maple monkey moon moo pan pawn peg pig pike pot reason rest ride sage "
    "salt silver slash slim spec spice squid tea teal turtle zone boa chapel dylan felix monte nit rita sophia savi jasmin "
    "hare odin opa org http bc idl pas ms po sc sp st eg ex nb ti cp cr cs hs jl jp pl rb rd rs sh sv td tf ts wl xq "
    "fan irc mime md nt nsh rout tap tid tls tnt ttl usd wat zeek cel cry duel fif func ik kal lid ml mf peg q k j "
    "react bare basic carbon crystal elm lean pony red racket scheme unicon xten apache console spice tal gd ec".split()
)
# language names that are also ordinary nouns or names: half the weight
AMBIGUOUS = set(
    "python java ruby rust swift julia go dart perl ada eiffel elixir shell batch "
    "spring flask node pip helm cargo rails jest mocha angular hypothesis yarn cypress selenium playwright kafka pandas maven".split()
)
# tools and formats pygments has no lexer for, or names under another spelling
TOOLS = set(
    "kubernetes k8s terraform ansible helm jq git github gitlab npm yarn pnpm pip cargo webpack vite eslint prettier "
    "pytest jest junit mocha vitest rails flask fastapi spring angular svelte nextjs next.js node node.js nodejs pandas "
    "scipy pytorch tensorflow postgres postgresql sqlite redis kafka mongodb elasticsearch graphql grpc protobuf vba "
    "cron crontab systemd dockerfile wasm webassembly gcc clang gradle maven xcode flutter dotnet .net laravel symfony "
    "selenium playwright cypress regex regexp grep powershell vscode hypothesis asyncio goroutine flexbox "
    "chmod chown sudo ssh curl wget sed awk vim emacs bashrc zshrc".split()
)
ARTEFACTS = set(
    # English
    "function functions method methods class classes query queries regex kernel resource resources script scripts test "
    "tests migration migrations module modules shader contract predicate playbook macro procedure endpoint component "
    "widget decorator parser lexer compiler interpreter struct interface schema config workflow pipeline routine "
    "subroutine one-liner command snippet program library package api cli handler middleware hook trait enum variable "
    "loop array algorithm cache benchmark fixture mock stub lambda closure callback thread coroutine iterator generator "
    "template controller database column index string dictionary list tuple target unit file code job unit-test "
    # French
    "fonction fonctions méthode méthodes classe classes requête requêtes ressource noyau contrat prédicat procédure "
    "composant décorateur analyseur schéma programme bibliothèque commande boucle tableau algorithme colonne chaîne "
    "liste dictionnaire fichier code".split()
)
ARTEFACT_PHRASES = ("regular expression", "expression régulière", "unit test", "test unitaire", "stored procedure", "procédure stockée", "linked list", "liste chaînée", "data structure", "structure de données", "hash map", "binary tree", "list comprehension", "compréhension de liste", "config file", "fichier de configuration")
REQUEST_VERBS = set(
    "write create implement generate add build make fix debug refactor optimize optimise convert define setup set configure "
    "rewrite port mock parse validate explain deploy profile "
    "écris écrire écrivez crée créer créez implémente implémenter génère générer ajoute ajouter corrige corriger optimise "
    "optimiser convertis convertir définis définir configure configurer réécris débogue déboguer refactorise explique déploie".split()
)
VOCABULARY = set(
    # English
    "refactor refactoring traceback stacktrace segfault segmentation compile compiler compiles compiling debug debugging "
    "linker runtime exception exceptions malloc pointer pointers mutex deadlock async await nullpointerexception null "
    "undefined recursion recursive memoization memoize endpoint repository commit linter lint stdout stderr printf "
    "iterator borrow checker goroutine coroutine threads boolean integer integers float floats bytes dataframe "
    "implementation algorithm quicksort mergesort o(n) complexity http json yaml sql html css regex unittest "
    # French
    "déboguer débogue débogage bogue compiler compile algorithme récursif récursive dépôt mémoïsation complexité "
    "exception entiers booléen".split()
)
VOCABULARY_PHRASES = (
    "binary search", "recherche dichotomique", "time complexity", "big o", "hash table", "table de hachage", "stack trace",
    "memory leak", "fuite de mémoire", "race condition", "borrow checker", "null pointer", "reverse proxy", "pull request",
)
# a word counts once: as a tool or language, else as an artefact, else as vocabulary
VOCABULARY -= ARTEFACTS | TOOLS
WEAK = set("error errors bug crash install build deploy server type types optimize erreur serveur installer unitaire unitaires".split())
GENRES = set(
    "poem poems poetry haiku sonnet limerick story stories tale novel song songs chorus lyrics toast speech letter essay "
    "play screenplay poème poésie haïku histoire conte roman chanson chansons refrain paroles discours lettre théâtre".split()
)
PASCAL_IDENTIFIER = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z0-9]+)+\b")  # ArrayList, GenServer: a sign (McDonald too)
IDENTIFIER = re.compile(r"\b[a-z]+(?:_[a-z0-9]+)+\b|\b[a-z]+[A-Z][a-zA-Z]+\b|\b\w+\(\)|\b[A-Z]\w*(?:Error|Exception)\b|(?<!\w)--[a-z][\w-]+|\b\w+\.(?:js|ts|py)\b")

# Code written *in* the prompt, one line of it among words ("def add(a, b): return a - b
# -- can you spot the bug?"): marks of syntax that prose does not make. Each kind
# counts once; two kinds make code, one counts as a sign.
SYNTAX_MARKS = {
    "a call": re.compile(r"\b[A-Za-z_][\w.]*\([^()\n]{0,80}\)"),
    "an assignment or comparison": re.compile(r"[\w\])'\"]\s?(?:==|!=|<=|>=|:=|\+=|-=|\*=|=|<|>)\s?[\w\[{('\"$.-]"),
    "brackets": re.compile(r"[\w)\]]\[[^\]\n]*\]|\{[^{}\n]*\}|\{\s*$"),
    "an operator": re.compile(r"===|!==|&&|\|\||\+\+|--(?=\w)|=>|->|::|<\w+>|\);|[)\]\w];\s*(?:\}|$)|\$[A-Za-z_]\w*|\w\.\w+\(", re.M),
    "a keyword": re.compile(r"(?:^|[.:;!?]\s+|\s--\s)(?:def|class|for|while|if|elif|return|import|from|const|let|var|function|fn|func|int|char|void|std|SELECT|UPDATE|INSERT|DELETE|CREATE|echo|chmod|sudo|ls|cd|grep|curl|git|npm|pip|print|printf|console|x|i)\b[ (:=.\[]", re.M),
}
# programming concepts: what a programming question names even without code
CONCEPTS = (
    "linked list", "liste chaînée", "binary tree", "arbre binaire", "binary search", "search tree", "hash map", "hashmap", "hash table",
    "stack and a queue", "pile et une file", "deux piles", "two stacks", "priority queue", "a trie", "graph traversal", "shortest path",
    "topologically", "topological sort", "dependency injection", "design pattern", "visitor pattern", "singleton", "single responsibility",
    "solid principles", "abstract class", "interface instead", "object-oriented", "orientée objet", "garbage collection", "ownership and borrowing",
    "by reference", "par référence", "const and var", "promises", "promise", "callback", "goroutine", "substring", "sous-chaîne", "palindromic", "permutations",
    "fibonacci", "tower of hanoi", "tour de hanoï", "bit operations", "bitwise", "set bits", "power of two", "standard input", "stdin", "stdout",
    "in place", "en place", "linear time", "temps linéaire", "logarithmic time", "constant memory", "o(1)", "o(n)", "o(log n)",
    "time complexity", "complexité", "recursion", "récursivité", "recursive", "récursive", "memoize", "memoization",
    "database schema", "foreign key", "primary key", "join two tables", "two columns", "sql injection", "injections sql", "rest api", "api rest",
    "http status", "status code", "paginate", "pagination", "hash a password", "store passwords", "bcrypt", "unit test", "test unitaire",
    "pass locally", "in ci", "mock the", "for loop", "while loop", "boucle for", "let, const and var", "variables without", "variable without",
    "deep copy", "shallow copy", "segfault", "segmentation fault", "memory leak", "fuite de mémoire", "race condition", "mutex", "deadlock",
    "thread and a process", "process and a thread", "thread et un processus", "processus et un thread", "multithreading",
    "tcp and udp", "port 8080", "listening on port", "self-signed certificate", "ssh key", "clé ssh", "reverse proxy", "proxy inverse",
    "dark mode toggle", "responsive", "sticky", "onclick", "div", "dom", "css", "html", "website", "site web", "web page", "page web",
    "deployment and a statefulset", "statefulset", "helm release", "roll back a", "cron job", "tâche planifiée", "planifier une tâche",
    "command line", "ligne de commande", "environment variable", "variable d'environnement", "virtual environment", "environnement virtuel",
    "package to pypi", "pypi", "merge conflict", "conflit de fusion", "commit", "pull request", "branch", "branche distante",
    "the -j flag", "flag of", "context manager", "block of code", "decorator", "lambda", "map and filter", "map et filter",
    "print statement", "python 2", "python 3", "pgcd", "gcd", "algorithme d'euclide", "euclidean algorithm", "prime numbers", "nombres premiers",
    "multiplication table", "table de multiplication", "random password", "mot de passe aléatoire", "validate an email", "valider un email",
    "index in a database", "un index", "an index", "schema for", "lire un fichier", "read a file", "read a line", "fichier ligne par ligne",
    "two numbers that add up", "duplicates", "doublons", "anagrams", "anagrammes", "vowels", "voyelles", "non-repeating", "overlapping intervals",
    "keyword", "mot-clé", "volatile", "declare", "déclarer", "constant", "constante", "squash", "rebase", "fizzbuzz", "datetime", "timestamp",
    "timezone", "fuseau horaire", "react component", "composant react", "re-render", "props", "insertion sort", "tri par insertion",
    "bubble sort", "tri à bulles", "quicksort", "tri rapide", "container", "conteneur", "parenthese", "parentheses", "parenthèses",
)
CONCEPT_PATTERNS = {c: re.compile(r"(?<!\w)" + re.escape(c) + r"(?!\w)") for c in CONCEPTS}  # compiled once, not per prompt
CODE_ACTIONS = set(
    "reverse find return merge sort count compute print read check swap serialize deserialize detect remove implement calculate "
    "inverse trouve trouver calcule calculer trie trier vérifie vérifier compte compter affiche afficher lis lire génère supprime "
    "fusionne fusionner".split()
)


KNOWN = ARTEFACTS | VOCABULARY | WEAK | REQUEST_VERBS | CODE_ACTIONS | GENRES | {c for c in CONCEPTS if " " not in c}

# artefacts that ordinary requests make too ("create a packing list"): a sign, not a request shape
ORDINARY_ARTEFACTS = set("list liste table file fichier string chaîne index column colonne target job unit template".split())


def _singular(word: str) -> str:  # used only where the word lists know the singular (KNOWN)
    """dictionaries -> dictionary, commits -> commit, listes -> liste: the word lists hold singulars."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def syntax_marks(prompt: str) -> list[str]:
    """The kinds of code syntax the prompt holds (outside a fence)."""
    return [kind for kind, pattern in SYNTAX_MARKS.items() if pattern.search(prompt)]


CODE_LINE = re.compile(
    r"^\s*(def |class |import |from \S+ import|function |const |let |var |#include|public |private |fn |func |package |return\b|if \(|for \(|while \()"
    r"|[;{}]\s*$|^\s{4,}\S|=>|->|::|\w+\([^)]*\)\s*[{:]?\s*$"
)


@dataclass(frozen=True)
class Classification:
    kind: str  # "code" | "text"
    reason: str

    @property
    def is_code(self) -> bool:
        return self.kind == "code"


@cache
def _lexer_vocabulary() -> tuple[frozenset[str], re.Pattern]:
    """Language names and aliases, and a file-name pattern of their extensions, from pygments."""
    names, extensions = set(), set()
    for name, aliases, patterns, _ in get_all_lexers():
        for word in (name.lower(), *(a.lower() for a in aliases)):
            if " " not in word and word not in COMMON_WORDS and len(word) > 1:
                names.add(word)
        for pattern in patterns:
            match = re.fullmatch(r"\*\.([A-Za-z0-9+_-]{1,12})", pattern)
            if match and match.group(1).lower() not in ("txt", "text", "md", "log", "csv", "pdf"):
                extensions.add(re.escape(match.group(1).lower()))
    file_name = re.compile(r"(?<![\w/])[\w./-]+\.(" + "|".join(sorted(extensions, key=len, reverse=True)) + r")\b|\b(Dockerfile|Makefile|CMakeLists\.txt)\b", re.I)
    return frozenset(names | TOOLS), file_name


COMMON_LANGUAGES = {"Python", "JavaScript", "TypeScript", "Rust", "Go", "Java", "C", "C++", "C#", "Ruby", "PHP", "Bash", "SQL", "Kotlin", "Swift", "HTML", "CSS", "JSON", "YAML", "TOML"}


def _language(lines: list[str]) -> str:
    """pygments' guess, named only when it is a common language (it guesses
    exotic ones on short snippets)."""
    try:
        name = guess_lexer("\n".join(lines)).name
    except ClassNotFound:
        return ""
    return f" ({name})" if name in COMMON_LANGUAGES else ""


def _words(prompt: str) -> list[str]:
    text = unicodedata.normalize("NFC", prompt.lower())
    return re.findall(r"[\w+#.'-]*[\w+#]", text)


def _score(prompt: str) -> tuple[int, list[str]]:
    names, _ = _lexer_vocabulary()
    originals = [w.strip("'.") for w in _words(prompt)]
    # each word as the lists hold it: itself when they know it, else its singular
    words = [w if w in KNOWN or _singular(w) not in KNOWN else _singular(w) for w in originals]
    lowered = " ".join(words)
    raw = unicodedata.normalize("NFC", prompt.lower())
    found: list[str] = []
    score = 0
    languages = {w for w in originals if w in names} | ({"c"} if re.search(r"(?<![\w.])C(?![\w#+])", prompt) else set())
    for language in sorted(languages):
        # "in C", "en Rust", "using Go": a language named as one, whatever else the word means
        named = re.search(r"\b(?:in|en|with|using|avec|for|pour)\s+" + re.escape(language.capitalize()) + r"(?![\w#+])", prompt)
        weight = 1 if (language in AMBIGUOUS or len(language) == 1) and not named else 2
        score += weight
        found.append(language)
    artefacts = [i for i, w in enumerate(words) if w in ARTEFACTS]
    phrases = [p for p in ARTEFACT_PHRASES if p in lowered]
    if artefacts or phrases:
        score += 1
        found += [words[i] for i in artefacts[:2]] + phrases[:1]
    verbs = [i for i, w in enumerate(words) if w in REQUEST_VERBS]
    strong = [a for a in artefacts if words[a] not in ORDINARY_ARTEFACTS]
    if any(0 < a - v <= 5 for v in verbs for a in strong) or (verbs and phrases):
        score += 1
        found.append("request shape")
    vocabulary = sorted({w for w in words if w in VOCABULARY} | set(IDENTIFIER.findall(prompt)) | {p for p in VOCABULARY_PHRASES if p in lowered})
    if vocabulary:
        score += 2
        found += vocabulary[:2]
    weak = sorted({w for w in words if w in WEAK})
    score += min(len(weak), 1)
    found += weak[:1]
    pascal = PASCAL_IDENTIFIER.findall(prompt)
    if pascal:
        score += 1
        found.append(pascal[0])
    marks = syntax_marks(prompt)
    if marks:
        score += 2 if len(marks) >= 2 else 1
        found += marks[:2]
    concepts = [c for c in CONCEPTS if CONCEPT_PATTERNS[c].search(raw) or CONCEPT_PATTERNS[c].search(lowered)]
    if concepts:
        score += 2
        found += concepts[:2]
    if any(0 < a - v <= 6 for v in (i for i, w in enumerate(words) if w in CODE_ACTIONS) for a in artefacts):
        score += 1
        found.append("task on data")
    genres = sorted({w for w in words if w in GENRES})
    if genres:
        score -= 2
        found.append("not: " + genres[0])
    return score, found


# The detector reads at most this much of a prompt (a code fence anywhere still
# counts: finding one is a fast scan): a pasted file or log decides by its start,
# and a 5 MB paste costs what 4 kB does, on whatever thread asks (0.5 MB took
# 8.4 s on the UI's event loop before). Each line is read up to LINE_CHARS.
READ_CHARS = 4_000
LINE_CHARS = 400


def classify(prompt: str) -> Classification:
    """The rules, then (what they leave as text) the default model's topic probe."""
    result = rules_only(prompt)
    if result.is_code:
        return result
    topic = topic_probe.probability(prompt[: topic_probe.READ_CHARS])
    if topic is None:
        return result
    if topic >= 0.5:
        return Classification("code", f"a programming topic to the model (p={topic:.2f}); {result.reason}")
    return Classification("text", f"{result.reason}; not a programming topic to the model (p={topic:.2f})")


def rules_only(prompt: str) -> Classification:
    if "```" in prompt or "~~~" in prompt:
        return Classification("code", "code fence")
    prompt = prompt[:READ_CHARS]
    _, file_name = _lexer_vocabulary()
    name = file_name.search(prompt)
    if name:
        return Classification("code", f"file name {name.group(0)}")
    lines = [line[:LINE_CHARS] for line in prompt.splitlines() if line.strip()]
    code_lines = [line for line in lines if CODE_LINE.search(line)]
    if len(code_lines) >= 2 and len(code_lines) * 2 >= len(lines) - 1:
        return Classification("code", f"source lines{_language(code_lines)}")
    score, found = _score(prompt)
    if score >= 2:
        return Classification("code", "signs: " + ", ".join(found))
    return Classification("text", "no code signs" if not found else "too few code signs: " + ", ".join(found))


def temperature_for(prompt: str, temperature: float, code_temperature: float, auto: bool = True) -> tuple[float, Classification]:
    """The temperature to use and why. With auto off, always `temperature`."""
    result = classify(prompt)
    if auto and result.is_code:
        return code_temperature, result
    return temperature, result
