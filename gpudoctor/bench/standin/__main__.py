"""`python3 -m gpudoctor.bench.standin …`: the same stand-in as `gpudoctor bench standin …`."""

from gpudoctor.bench.standin.server import main

main()
