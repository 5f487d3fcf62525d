from .cli import main

# The same program name as the installed script: usage lines, and shell completion
# (_PACKFS_COMPLETE), are the same either way.
main(prog_name="packfs")
