"""nerfstudio method specifications for bytesplat and its variants."""
