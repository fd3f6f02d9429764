"""What the tests of the chapters' prose share: the pattern of a MyST role."""

import re

#: An inline MyST role with its content: {glue:text}`x`, {cite}`x`, {eq}`x`, {ref}`x`, ...
ROLE = re.compile(r"\{[a-z:-]+\}`[^`]*`")
