# The feedmux sampler image: feedmux and its four dependencies, nothing else.
#
#   docker build -t feedmux .
#   docker run --rm -p 127.0.0.1:5555-5556:5555-5556 feedmux     # serves example data
#
# BASE_IMAGE lets a machine without registry access build on a local Python image:
#   docker build --build-arg BASE_IMAGE=localhost/my-python:3.11 -t feedmux .
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/feedmux \
    PATH=/opt/feedmux/bin:$PATH

RUN python3 -m venv /opt/feedmux \
 && useradd --create-home --uid 10001 --shell /usr/sbin/nologin feedmux \
 && mkdir /results && chown feedmux /results

# The dependencies first, from pyproject.toml alone, so that a change to the code
# does not download them again.
WORKDIR /tmp/feedmux-src
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && pip install -r requirements.txt

COPY README.md ./
COPY feedmux/ feedmux/
RUN pip install --no-deps . \
 && cd / && rm -rf /tmp/feedmux-src \
 && feedmux --version

WORKDIR /home/feedmux
USER feedmux

# Data and control endpoints (both ROUTER sockets).
EXPOSE 5555 5556

ENTRYPOINT ["feedmux"]
# Inside a container, binding 0.0.0.0 is right and necessary: loopback would be
# unreachable from other containers and from the published ports. Who can reach
# the container is decided where its ports are published (e.g. 127.0.0.1:5555:5555)
# and by the network it is attached to; feedmux itself binds loopback by default.
CMD ["serve", "feedmux.apps.demo:make_example_mux", \
     "--bind", "tcp://0.0.0.0:5555", "--control", "tcp://0.0.0.0:5556"]
