"""The short form of a traceback, on IPython's entries as a kernel sends them (plain here; the
gateway's tests read it from real kernels)."""

from __future__ import annotations

from kernel_pool._tracebacks import NO_NETWORK, short_form

RULE = "-" * 75


def header(ename: str) -> str:
    return f"{ename:<42}Traceback (most recent call last)"


def library(number: int) -> str:
    return (f"File /opt/venv/lib/python3.11/site-packages/lib/m.py:{number}, in f{number}()\n"
            f"--> {number} f{number + 1}()\n")


def test_short_form_folds_a_recursion_as_the_frames_around_it() -> None:
    frame = "Cell In[1], line 2, in f(n)\n----> 2     return f(n + 1)\n"
    short = short_form([RULE, header("RecursionError"), frame, frame,
                        "    [... skipping similar frames: f at line 2 (987 times)]", frame,
                        "RecursionError: maximum recursion depth exceeded"])
    assert short.count("Cell In[1]") == 3
    assert "[... skipping similar frames: f at line 2 (987 times)]" in short


def test_short_form_without_user_frames_keeps_where_it_was_raised() -> None:
    short = short_form([RULE, header("ValueError"), library(1), library(2), library(3),
                        "ValueError: bad"])
    assert short == (f"[... 2 frames in library code]\n\n{library(3).rstrip()}\n\n"
                     "ValueError: bad")


def test_short_form_of_a_workspace_module_keeps_its_frame() -> None:
    module = "File /home/user/etl.py:3, in load(path)\n----> 3     return parse(path)\n"
    compiled = "File index.pyx:167, in pandas._libs.index.IndexEngine.get_loc()\n"
    short = short_form([RULE, header("KeyError"), "Cell In[2], line 1\n----> 1 load('x')\n",
                        module, compiled, library(5), "KeyError: 'x'"])
    assert short == ("Cell In[2], line 1\n----> 1 load('x')\n\n" + module.rstrip() +
                     "\n\n[... 2 frames in library code]\n\nKeyError: 'x'")


def test_short_form_of_another_languages_error_is_whole_with_the_network_note() -> None:
    node = ["Error: getaddrinfo EAI_AGAIN example.com",
            "    at GetAddrInfoReqWrap.onlookupall [as oncomplete] (node:dns:120:26)"]
    assert short_form(node) == "\n".join(node) + "\n\n" + NO_NETWORK
    assert short_form(["Error in f(): boom"]) == "Error in f(): boom"
    assert short_form([]) == ""


def test_short_form_notes_the_network_only_from_exception_lines() -> None:
    # urllib3's source shows "except socket.gaierror" in frames of any of its errors
    frame = ("File /opt/venv/lib/python3.11/site-packages/urllib3/connection.py:245, in "
             "HTTPConnection._new_conn(self)\n    245 except socket.gaierror as e:\n")
    cell = "Cell In[3], line 1\n----> 1 fetch()\n"
    assert NO_NETWORK not in short_form([RULE, header("ReadTimeoutError"), cell, frame,
                                         "ReadTimeoutError: read timed out"])
    assert short_form([RULE, header("gaierror"), frame,
                       "gaierror: [Errno -3] Temporary failure in name resolution",
                       "\nDuring handling of the above exception, another exception occurred:\n",
                       header("URLError"), cell, "URLError: <urlopen error [Errno -3] ...>",
                       ]).endswith("URLError: <urlopen error [Errno -3] ...>\n\n" + NO_NETWORK)
