FROM python:3.11-slim
RUN useradd --create-home --uid 10001 llmtap && mkdir /data && chown llmtap /data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY analysis ./analysis
RUN pip install --no-cache-dir .
USER llmtap
ENV LLMTAP_HOME=/data
VOLUME /data
EXPOSE 8787
ENTRYPOINT ["llmtap"]
CMD ["serve", "--host", "0.0.0.0", "--allow-remote"]
