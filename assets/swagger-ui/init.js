// Renders /openapi.yaml. validatorUrl: null keeps the page from calling validator.swagger.io.
window.ui = SwaggerUIBundle({
  url: "/openapi.yaml",
  dom_id: "#docs",
  deepLinking: true,
  validatorUrl: null,
  persistAuthorization: true,
});
