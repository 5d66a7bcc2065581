"""termchat: a terminal chat and coding assistant built around speculative decoding.

This package's top level imports nothing outside the standard library, so that
`python3 -m termchat.bootstrap` works from a clean clone before anything is installed.
"""

__version__ = "0.1.0"
