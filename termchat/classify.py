"""Is a prompt about code? -> which temperature to use.

Low temperature keeps speculation's acceptance rate high, and code wants it
anyway, so code prompts use the profile's `code_temperature`. The rules, in
order: a code fence; a file name with a source extension; lines that look
like source (checked with pygments' lexer guessing); programming vocabulary in
English or French (strong words count 2, weak ones 1; 2 makes code).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from pygments.lexers import guess_lexer
from pygments.util import ClassNotFound

EXTENSIONS = (
    "py pyi ipynb js mjs cjs ts tsx jsx rs go java kt kts scala c h cc cpp cxx hpp cs rb php pl pm lua r jl "
    "swift m mm sh bash zsh fish ps1 bat sql toml yaml yml json xml html htm css scss sass vue svelte dart "
    "ex exs erl hs ml mli clj elm zig nim v sv vhd tf proto gradle cmake mk dockerfile makefile lock ini cfg"
).split()
FILE_NAME = re.compile(r"(?<![\w/])[\w./-]+\.(" + "|".join(EXTENSIONS) + r")\b|\b(Dockerfile|Makefile|CMakeLists\.txt)\b", re.I)

STRONG = {
    # English
    "refactor", "refactoring", "traceback", "stacktrace", "segfault", "regex", "regexp", "compile", "compiler",
    "compiles", "debug", "debugging", "function", "functions", "method", "class", "api", "sql", "query", "python",
    "javascript", "typescript", "rust", "golang", "java", "kotlin", "c++", "c#", "bash", "shell", "git", "docker",
    "json", "yaml", "jest", "pytest", "unittest", "junit", "vitest", "mocha", "npm", "pip", "cargo", "implement",
    "algorithm", "snippet", "bug", "exception", "null", "nullpointerexception", "undefined", "async", "await",
    "endpoint", "dockerfile", "kubernetes", "html", "css", "react", "django", "flask", "numpy", "pandas", "linter",
    "lint", "typescript's", "repository", "commit", "variable", "variables", "recursion", "recursive", "struct",
    "enum", "interface", "lambda", "iterator", "def", "const", "printf", "stdout", "stderr", "cli",
    # French
    "fonction", "fonctions", "méthode", "méthodes", "classe", "requête", "déboguer", "débogue", "débogage",
    "bogue", "compiler", "compile", "implémente", "implémenter", "algorithme", "tableau", "boucle", "récursif",
    "récursive", "dépôt", "variable",
}
WEAK = {
    "code", "test", "tests", "error", "errors", "script", "loop", "array", "list", "string", "install", "build",
    "deploy", "server", "database", "program", "programme", "file", "fix", "crash", "type", "types", "library",
    "module", "package", "écris", "écrire", "corrige", "erreur", "fichier", "bibliothèque", "chaîne", "liste",
    "serveur", "programme", "unitaire", "unitaires", "optimise", "optimize",
}
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
    return re.findall(r"[\w+#']+", text)


def classify(prompt: str) -> Classification:
    if "```" in prompt or "~~~" in prompt:
        return Classification("code", "code fence")
    name = FILE_NAME.search(prompt)
    if name:
        return Classification("code", f"file name {name.group(0)}")
    lines = [line for line in prompt.splitlines() if line.strip()]
    code_lines = [line for line in lines if CODE_LINE.search(line)]
    if len(code_lines) >= 2 and len(code_lines) * 2 >= len(lines) - 1:
        return Classification("code", f"source lines{_language(code_lines)}")
    words = _words(prompt)
    strong = sorted({w for w in words if w in STRONG})
    weak = sorted({w for w in words if w in WEAK})
    score = 2 * len(strong) + len(weak)
    if score >= 2:
        return Classification("code", "words: " + ", ".join(strong + weak))
    return Classification("text", "no code signs")


def temperature_for(prompt: str, temperature: float, code_temperature: float, auto: bool = True) -> tuple[float, Classification]:
    """The temperature to use and why. With auto off, always `temperature`."""
    result = classify(prompt)
    if auto and result.is_code:
        return code_temperature, result
    return temperature, result
