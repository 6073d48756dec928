"""Where the converter's images come from: one module per kind of input.

Each ``*_source`` function checks its input, lists it without decoding anything, and returns
a ``manifest.Source``: class names, and per split a list of ``Item``s (file paths, HDF5 rows) or
a ``LazySplit`` read range by range. Only the workers open the images. A bad input is a
``ConvertError`` with a one-line message naming the flag. ``cli.open_source`` picks one.
"""
