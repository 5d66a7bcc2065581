"""The one exception type users see as a message instead of a traceback."""


class UserError(Exception):
    """A problem the user can fix: printed as-is, exit code 2, no traceback.

    The message should say what is wrong, where (file:line when there is one)
    and what to do.
    """

    exit_code = 2
