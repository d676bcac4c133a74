"""The lab's rules: validation, dependent changes and the edits that apply them, derived sizes, memory,
repairs, the runtime's verdict, script import. Imports lab.core only."""
