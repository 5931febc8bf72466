"""The house rules, the docs and the repository as a whole: imports, citations, links, documented command lines, the wheel, the CI examples, the test plugins."""
