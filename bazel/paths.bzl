"""Where syncnorm's sources sit in the execution root, in any workspace."""

def workspace_root():
    """The root of the repository of the BUILD file being evaluated.

    "" in syncnorm's own workspace; "external/<name>" where syncnorm is a
    dependency (<name> is what the user's WORKSPACE called it). Source files
    are at <root>/<package>/..., generated ones under $(GENDIR)/<root>/...

    Returns:
      The path, relative to the execution root, without a trailing slash.
    """
    name = native.repository_name()
    return "" if name == "@" else "external/" + name[1:]

def join(*parts):
    """parts joined with "/", leaving out empty ones and "."."""
    return "/".join([p for p in parts if p and p != "."])
