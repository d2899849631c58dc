#!/usr/bin/env python3
"""check_links.py ROOT [FILE.md ...] - fails (exit 1) on a dead relative link.

Checks every Markdown link [text](target) of the Markdown files under ROOT
(build folders and hidden ones left out), or of the files given: a relative target must name a file or folder that
exists, and a #anchor must be one that a heading of the target Markdown file
makes (GitHub's rule: lower case, punctuation dropped, spaces to hyphens, a
repeated heading numbered -1, -2, ...).  Links inside code are not links.
"""
import os
import re
import sys

LINK = re.compile(r'(?<!!)\[([^\]]*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)|!\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^\s*(```|~~~)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def prose_lines(path):
    """(line number, text) of the lines outside fenced code, inline code blanked."""
    fenced = False
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                fenced = not fenced
                continue
            if not fenced:
                yield n, re.sub(r'`[^`]*`', lambda m: ' ' * len(m.group(0)), line)


def slug(text):
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)  # a link's text
    text = text.replace('`', '').lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    seen, found = {}, set()
    fenced = False
    with open(path, encoding='utf-8') as f:
        for line in f:
            if FENCE.match(line):
                fenced = not fenced
                continue
            m = None if fenced else HEADING.match(line)
            if m:
                s = slug(m.group(2))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.add(s if k == 0 else '%s-%d' % (s, k))
    return found


def check(path):
    """The dead links of one file, as messages."""
    dead = []
    here = os.path.dirname(path)
    for n, line in prose_lines(path):
        for m in LINK.finditer(line):
            target = m.group(2) or m.group(3)
            if re.match(r'^[a-z][a-z0-9+.-]*:', target, re.I):  # http:, mailto: ...
                continue
            name, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(here, name)) if name else path
            if not os.path.exists(dest):
                dead.append('%s:%d: %s: no such file' % (path, n, target))
            elif anchor and dest.endswith('.md') and anchor not in anchors(dest):
                dead.append('%s:%d: %s: no heading makes #%s' % (path, n, target, anchor))
    return dead


def main(argv):
    if len(argv) < 2:
        print('usage: check_links.py ROOT [FILE.md ...]', file=sys.stderr)
        return 2
    root = argv[1]
    files = argv[2:]
    if not files:
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(('.', 'build')))
            files += sorted(os.path.join(folder, f) for f in names if f.endswith('.md'))
    dead = [d for f in files for d in check(f)]
    for d in dead:
        print(d)
    print('%d files, %d dead links' % (len(files), len(dead)))
    return 1 if dead else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
