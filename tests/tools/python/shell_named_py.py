#!/bin/sh
# A shell script named .py, for the launcher's --no-python test: run as it
# is it prints its line; handed to Python it is a syntax error.
echo "rank $RANK ran as a shell script with $*"
