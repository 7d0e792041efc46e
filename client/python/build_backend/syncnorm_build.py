"""syncnorm's PEP 517 build backend: Bazel builds the C++, this packs it.

It uses only the standard library, so pip's build isolation has nothing to
install. `pip wheel` and `pip install` call build_wheel; pip cannot make an
sdist, so this file does that when run:

    /usr/bin/python3 client/python/build_backend/syncnorm_build.py sdist OUT_DIR

Where the C++ sources are, in this order:
  1. `workspace/` next to pyproject.toml: an unpacked sdist, which holds the
     part of the syncnorm workspace that the wheel's targets need;
  2. `../..`: pyproject.toml is client/python of a syncnorm checkout;
  3. $SYNCNORM_SOURCE_DIR: a syncnorm checkout.
A copy of client/python alone has none of them, and the build stops saying
what to do.

The wheel holds the package's Python sources, the extension and the
aggregator and syncnormctl programs, built with `bazel build
--config=release` (-c opt: NDEBUG; stripped). Its metadata names the Debian
packages of the shared libraries they link (Requires-External). Environment:
SYNCNORM_BAZEL (the bazel command; default bazel), SYNCNORM_BAZEL_FLAGS
(more `bazel build` flags, shell-quoted), SYNCNORM_CUDA (0: a CPU-only
build even where the CUDA toolkit is; docs/bazel.md, "Using syncnorm from
your Bazel workspace").
"""

import base64
import hashlib
import io
import os
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile

# pyproject.toml's folder.
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Reproducible archives: every member gets this time.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_TAR_MTIME = 315532800  # 1980-01-01
# Flags of every Bazel build of the wheel. A fixed PATH for actions: pip
# runs the backend with its build environment's folders first on PATH,
# which would change every action's key on every pip run.
_BAZEL_BUILD_FLAGS = ["--config=release", "--incompatible_strict_action_env"]


class BuildError(RuntimeError):
    """The build cannot go on; the message says why and what to do."""


# ---- PEP 517 hooks --------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    _check_interpreter()
    pyproject = _pyproject()
    workspace = _workspace()
    version = _version(workspace)
    binaries = pyproject["tool"]["syncnorm"]["binaries"]
    bazel_bin = _build(workspace, list(binaries))
    files = _python_sources() + [
        (arcname, _output_path(bazel_bin, label))
        for label, arcname in binaries.items()]
    metadata = _metadata(pyproject, version) + "".join(
        "Requires-External: %s\n" % p
        for p in _runtime_packages([path for _, path in files
                                    if not path.endswith(".py")]))
    name = "syncnorm-%s-%s.whl" % (version, _wheel_tag())
    _write_wheel(os.path.join(wheel_directory, name), version, files,
                 metadata, _entry_points(pyproject["project"]))
    return name


def build_sdist(sdist_directory, config_settings=None):
    pyproject = _pyproject()
    workspace = _workspace()
    version = _version(workspace)
    base = "syncnorm-%s" % version
    members = [(rel, os.path.join(HERE, rel)) for rel in _package_files()]
    members += [("workspace/" + rel, os.path.join(workspace, rel))
                for rel in _workspace_files(workspace)]
    name = base + ".tar.gz"
    _write_sdist(os.path.join(sdist_directory, name), base, members,
                 _metadata(pyproject, version))
    return name


# ---- where things are -----------------------------------------------------


def _check_interpreter():
    include = sysconfig.get_paths()["include"]
    if (sys.implementation.name != "cpython" or
            sys.version_info[:2] != (3, 11) or
            include != "/usr/include/python3.11"):
        raise BuildError(
            "syncnorm's extension is built against Debian 12's CPython 3.11 "
            "headers (/usr/include/python3.11) and loads only in that "
            "interpreter; this is %s %d.%d with headers in %s. Run pip with "
            "/usr/bin/python3, or in a venv made from it "
            "(/usr/bin/python3 -m venv --system-site-packages ENV)." %
            (sys.implementation.name, sys.version_info[0],
             sys.version_info[1], include))


def _pyproject():
    """pyproject.toml: [project] and [tool.syncnorm] (binaries, platform)."""
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _is_workspace(path):
    try:
        with open(os.path.join(path, "WORKSPACE")) as f:
            return 'workspace(name = "syncnorm")' in f.read()
    except OSError:
        return False


def _workspace():
    """The syncnorm workspace to build in (see the module's comment)."""
    unpacked = os.path.join(HERE, "workspace")
    checkout = os.path.dirname(os.path.dirname(HERE))
    candidates = [unpacked]
    if os.path.basename(HERE) == "python" and \
            os.path.basename(os.path.dirname(HERE)) == "client":
        candidates.append(checkout)
    if os.environ.get("SYNCNORM_SOURCE_DIR"):
        candidates.append(os.path.abspath(os.environ["SYNCNORM_SOURCE_DIR"]))
    for path in candidates:
        if _is_workspace(path):
            return path
    raise BuildError(
        "no syncnorm C++ sources for %s: it is neither client/python of a "
        "syncnorm checkout nor an unpacked sdist (a copy of client/python "
        "alone holds no C++). Build from the checkout (pip install "
        "CHECKOUT/client/python), or from an sdist made there "
        "(/usr/bin/python3 CHECKOUT/client/python/build_backend/"
        "syncnorm_build.py sdist DIR; then pip install "
        "DIR/syncnorm-VERSION.tar.gz), or set SYNCNORM_SOURCE_DIR=CHECKOUT." %
        HERE)


def _version(workspace):
    with open(os.path.join(workspace, "VERSION")) as f:
        return f.read().strip()


def _python_sources():
    """(path in the wheel, file) of the package's .py files."""
    files = []
    root = os.path.join(HERE, "syncnorm")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                files.append((os.path.relpath(path, HERE), path))
    return files


def _package_files():
    """What an sdist holds of this folder, relative to it."""
    files = ["pyproject.toml", "build_backend/syncnorm_build.py"]
    files += [rel for rel, _ in _python_sources()]
    examples = os.path.join(HERE, "examples")
    if os.path.isdir(examples):
        files += ["examples/" + f for f in sorted(os.listdir(examples))
                  if f.endswith(".py")]
    return files


# ---- Bazel ----------------------------------------------------------------


def _bazel(workspace, args, capture=False):
    """Runs bazel in `workspace`; its stdout when `capture`."""
    startup = []
    if workspace == os.path.join(HERE, "workspace"):
        # An unpacked sdist (often pip's temporary folder): Bazel's output
        # goes next to it, so it goes away with it.
        startup = ["--output_base=" + os.path.join(HERE, ".bazel-output")]
    command = [os.environ.get("SYNCNORM_BAZEL", "bazel")] + startup + args
    print("syncnorm_build: " + " ".join(command), file=sys.stderr, flush=True)
    try:
        done = subprocess.run(
            command, cwd=workspace, check=False, text=True,
            stdout=subprocess.PIPE if capture else sys.stderr.fileno())
    except FileNotFoundError:
        raise BuildError("no `%s` command: the build needs Debian's Bazel "
                         "(bazel-bootstrap; scripts/deps.sh installs it)" %
                         command[0]) from None
    if done.returncode != 0:
        raise BuildError("`%s` failed (exit %d) in %s; its output is above" %
                         (" ".join(command), done.returncode, workspace))
    return done.stdout


def _build(workspace, labels):
    """Builds `labels` for release; returns the bazel-bin folder."""
    flags = _BAZEL_BUILD_FLAGS + shlex.split(
        os.environ.get("SYNCNORM_BAZEL_FLAGS", ""))
    try:
        _bazel(workspace, ["build"] + flags + labels)
        return _bazel(workspace, ["info"] + flags + ["bazel-bin"],
                      capture=True).strip()
    finally:
        if workspace == os.path.join(HERE, "workspace"):
            _bazel(workspace, ["shutdown"])


def _output_path(bazel_bin, label):
    """The file a cc_binary `//pkg:name` writes."""
    package, _, name = label[2:].partition(":")
    return os.path.join(bazel_bin, package, name)


def _workspace_files(workspace):
    """Files of the workspace that building the wheel's targets reads."""
    if workspace == os.path.join(HERE, "workspace"):
        return sorted(_walk(workspace))
    labels = " ".join(_pyproject()["tool"]["syncnorm"]["binaries"])
    query = ("let t = set(%s) in kind('source file', deps($t)) union "
             "buildfiles(deps($t))" % labels)
    out = _bazel(workspace, ["query", "--output=label", query], capture=True)
    files = set()
    for label in out.split():
        if label.startswith("//"):  # not another repository's
            package, _, name = label[2:].partition(":")
            files.add(os.path.join(package, name) if package else name)
    # What the WORKSPACE and .bazelrc read: bazel/ whole.
    files.update(["WORKSPACE", ".bazelrc"])
    files.update(os.path.join("bazel", f)
                 for f in _walk(os.path.join(workspace, "bazel")))
    return sorted(files)


def _walk(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith("bazel-")]
        for f in filenames:
            yield os.path.relpath(os.path.join(dirpath, f), root)


# ---- metadata -------------------------------------------------------------


def _metadata(pyproject, version):
    """Core metadata 2.1 (METADATA, PKG-INFO), without Requires-External."""
    project = pyproject["project"]
    lines = ["Metadata-Version: 2.1",
             "Name: " + project["name"],
             "Version: " + version,
             "Summary: " + project["description"],
             "Requires-Python: " + project["requires-python"]]
    lines += ["Classifier: " + c for c in project.get("classifiers", [])]
    lines.append("Supported-Platform: " +
                 pyproject["tool"]["syncnorm"]["supported-platform"])
    lines += ["Requires-Dist: " + d for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append("Provides-Extra: " + extra)
        lines += ['Requires-Dist: %s; extra == "%s"' % (d, extra)
                  for d in deps]
    return "\n".join(lines) + "\n"


def _entry_points(project):
    scripts = project.get("scripts", {})
    return "[console_scripts]\n" + "".join(
        "%s = %s\n" % item for item in sorted(scripts.items()))


def _wheel_tag():
    """cp311-cp311-linux_x86_64 for Debian 12's python3 on amd64."""
    impl = "cp%d%d" % sys.version_info[:2]
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return "%s-%s-%s" % (impl, impl, platform)


def _runtime_packages(binaries):
    """The Debian packages of the shared libraries `binaries` link (ldd),
    and a note for each library no package holds."""
    libs = set()
    for path in binaries:
        out = subprocess.run(["ldd", path], check=True, text=True,
                             stdout=subprocess.PIPE).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and \
                    parts[2].startswith("/"):
                libs.add(os.path.realpath(parts[2]))
    owners = {}
    # dpkg knows merged-/usr files under either path.
    candidates = sorted(libs) + sorted(p[len("/usr"):] for p in libs
                                       if p.startswith("/usr/"))
    try:
        out = subprocess.run(["dpkg", "-S"] + candidates, text=True,
                             stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout
    except FileNotFoundError:
        print("syncnorm_build: no dpkg: the wheel's metadata names no "
              "runtime packages", file=sys.stderr)
        return []
    for line in out.splitlines():
        packages, _, path = line.partition(": ")
        owners[path] = packages.split(", ")[0].split(":")[0]
    found = set()
    for lib in libs:
        owner = owners.get(lib) or owners.get(lib[len("/usr"):])
        found.add(owner or "%s (no Debian package: %s)" %
                  (os.path.basename(lib), os.path.dirname(lib)))
    return sorted(found)


# ---- archives -------------------------------------------------------------


def _record_hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _write_wheel(path, version, files, metadata, entry_points):
    dist_info = "syncnorm-%s.dist-info" % version
    generated = [
        (dist_info + "/METADATA", metadata),
        (dist_info + "/WHEEL",
         "Wheel-Version: 1.0\nGenerator: syncnorm_build\n"
         "Root-Is-Purelib: false\nTag: %s\n" % _wheel_tag()),
        (dist_info + "/entry_points.txt", entry_points),
        (dist_info + "/top_level.txt", "syncnorm\n"),
    ]
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        def add(arcname, data, mode):
            info = zipfile.ZipInfo(arcname, _ZIP_TIME)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
            record.append("%s,%s,%d" % (arcname, _record_hash(data),
                                        len(data)))

        for arcname, source in files:
            with open(source, "rb") as f:
                data = f.read()
            add(arcname, data, 0o755 if os.access(source, os.X_OK) and
                not arcname.endswith(".py") else 0o644)
        for arcname, text in generated:
            add(arcname, text.encode(), 0o644)
        record.append(dist_info + "/RECORD,,")
        info = zipfile.ZipInfo(dist_info + "/RECORD", _ZIP_TIME)
        info.external_attr = 0o100644 << 16
        wheel.writestr(info, "\n".join(record) + "\n",
                       zipfile.ZIP_DEFLATED)


def _write_sdist(path, base, members, pkg_info):
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as sdist:
        def add(arcname, data, mode):
            info = tarfile.TarInfo(base + "/" + arcname)
            info.size = len(data)
            info.mode = mode
            info.mtime = _TAR_MTIME
            sdist.addfile(info, io.BytesIO(data))

        add("PKG-INFO", pkg_info.encode(), 0o644)
        for arcname, source in sorted(members):
            with open(source, "rb") as f:
                data = f.read()
            add(arcname, data, 0o755 if os.access(source, os.X_OK) else 0o644)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sdist", "wheel"):
        sys.exit("usage: %s sdist|wheel OUT_DIR" % sys.argv[0])
    os.makedirs(sys.argv[2], exist_ok=True)
    hook = build_sdist if sys.argv[1] == "sdist" else build_wheel
    try:
        print(os.path.join(sys.argv[2], hook(sys.argv[2])))
    except BuildError as e:
        sys.exit("syncnorm_build: %s" % e)
