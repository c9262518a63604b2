"""The user's repository on the host: seeding a session's workspace from it, taking the
agent's work back out, and pushing it (issue 14; see docs/coding-task.md).

A repository is data from the user, not trusted code, and a workspace's ``.git`` is
written by the agent: every git command here goes through :func:`git.run_git`, which
never reads a workspace's own config or hooks and never prompts.
"""
