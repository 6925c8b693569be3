from django.urls import path

from dashboard import examples, views

app_name = "dashboard"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("examples/subscribe/", examples.subscribe, name="example-subscribe"),
]
